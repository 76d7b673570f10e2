"""Stock vLLM engines in the twin: the router sees them only through ``/metrics`` scrapes
on the virtual clock, as ``router.state.vllm_metrics.stock_snapshot`` makes them."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from kernels_bench.lab.replay.client import ClientSettings, stage_body
from kernels_bench.lab.replay.workload import Job
from kernels_bench.lab.twin.engine_spec import engine_specs
from kernels_bench.lab.twin.loop import VirtualLoop
from kernels_bench.lab.twin.router import RouterCosts, TwinRouter
from kernels_bench.lab.twin.run import run_config
from kernels_bench.lab.twin.sim import Simulator
from kernels_bench.lab.twin.step_time import StepTimeModel
from router.config.cluster import load_cluster_config
from router.state.vllm_metrics import VllmMetrics
from tests.lab.twin_helpers import REPLAY_PROFILES, REPLAY_TOML, write_profile
from tests.replay_fixture import tiny_trace

SCRAPE_S = 0.1


def test_a_stock_engines_view_changes_only_at_scrapes(tmp_path: Path) -> None:
    """Two stock engines (vLLM's priority scheduler) under lmetric, which reads the view:
    whenever the router looks, its snapshot of an engine is the last scrape's (a multiple
    of the interval), its counts are the engine's gauges at that scrape, and they stay put
    between scrapes while the engine's own counts move. vLLM's KV events still arrive."""
    trace = tiny_trace(tmp_path / "trace")
    cfg = load_cluster_config(REPLAY_TOML)
    engines = [dataclasses.replace(e, sched_policy="priority") for e in cfg.engines]
    cfg = run_config(cfg, engines, dataclasses.replace(cfg.router, policy="lmetric"))
    sim = Simulator()
    for spec in engine_specs(cfg, stock=True):
        cells, prefill = REPLAY_PROFILES[spec.entry]
        profile = write_profile(tmp_path / f"{spec.entry}.json", cells, prefill)
        sim.add_engine(spec, StepTimeModel(profile), telemetry=True)
    loop = VirtualLoop(sim)
    router = TwinRouter(cfg, loop, None, RouterCosts(charge_decision=False),
                        scrape_interval_s=SCRAPE_S)
    settings = ClientSettings({"tiny-a": "small", "tiny-b": "large"})
    bodies = [stage_body(Job(f"w{i}", run, 0.0), 1, 0, [], [], settings)
              for i, run in enumerate(trace.runs[:6])]
    gauges: dict[tuple[str, float], tuple[int, int]] = {}  # the engines' at each scrape
    sink = router.core.membership.subscriptions  # the router's telemetry sink
    apply = sink.scraped

    def scraped(engine: str, seq: int, sent: float, reading: VllmMetrics) -> None:
        m = sim.engines[engine].metrics
        gauges[engine, sim.now()] = (m.running, m.waiting)
        apply(engine, seq, sent, reading)

    sink.scraped = scraped  # type: ignore[method-assign]
    seen: list[tuple[str, float, float, tuple[int, int], tuple[int, int]]] = []

    def look() -> None:  # every 10 ms, 3.5 ms off the scrapes' grid
        for name, twin in sim.engines.items():
            snap = router.core.state.table[name].snapshot
            assert snap is not None
            seen.append((name, sim.now(), snap.ts, (snap.batch_size, snap.num_waiting),
                         (twin.metrics.running, twin.metrics.waiting)))
        loop.call_later(0.01, look)

    async def go() -> None:
        await router.start()
        loop.call_later(0.0035, look)
        for body in bodies:
            await asyncio.sleep(0.013)
            asyncio.ensure_future(router.send(body))
        await asyncio.sleep(3.0)
        await router.stop()

    try:
        loop.run_until_complete(go())
    finally:
        loop.close()
    moved_unseen = 0
    for name, now, ts, view, engine in seen:
        # the last scrape, none since; its counts are the engine's gauges then
        assert ts == pytest.approx(math.floor(now / SCRAPE_S) * SCRAPE_S, abs=1e-9)
        assert view == gauges[name, ts]
        moved_unseen += view != engine
    assert moved_unseen > 0  # the engine moved between scrapes; the router saw it later
    assert any(view[0] > 0 for _, _, _, view, _ in seen)
    stats = router.core.membership.stats
    assert stats.malformed_snapshot_frames == 0 and stats.engine_down_events == 0
    assert sum(stats.engines[n].kv_frames for n in sim.engines) > 0
    assert all(t.spec.stock and t.snapshots is None for t in sim.engines.values())


def test_an_engine_of_kind_vllm_is_twinned_as_stock() -> None:
    cfg = load_cluster_config(REPLAY_TOML)
    engines = [dataclasses.replace(cfg.engines[0], kind="vllm", sched_policy=None,
                                   starvation_threshold=None, quantum=None),
               cfg.engines[1]]
    a, b = engine_specs(dataclasses.replace(cfg, engines=engines))
    assert (a.stock, a.sched_policy) == (True, "fcfs")  # vLLM's default
    assert not b.stock
