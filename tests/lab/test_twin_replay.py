"""The twin's router and client layers: the real front and core on the virtual clock, the
replay's client, records as the live replay writes them (no engine server, no socket)."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from kernels_bench.lab.commands.replay import build_parser, replay_options
from kernels_bench.lab.commands.twin import main as twin_main
from kernels_bench.lab.replay.client import ClientSettings, stage_body
from kernels_bench.lab.replay.output import read_jsonl
from kernels_bench.lab.replay.records import RequestRecord
from kernels_bench.lab.replay.workload import Job
from kernels_bench.lab.twin import calibrate
from kernels_bench.lab.twin.loop import Stuck, VirtualLoop
from kernels_bench.lab.twin.router import RouterCosts
from kernels_bench.lab.twin.run import TwinOptions, load_profiles, twin
from kernels_bench.lab.twin.sim import Simulator
from router.config.cluster import load_cluster_config
from router.trace_format import Trace
from tests.lab.twin_helpers import (NO_CHARGE, REPLAY_TOML, replay_cluster,
                                    write_replay_profiles)
from tests.replay_fixture import tiny_trace, write_trace

MAP = "tiny-a=small,tiny-b=large"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return tiny_trace(tmp_path_factory.mktemp("trace"))


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_replay_profiles(tmp_path_factory.mktemp("profiles"))


def _args(out: Path, *extra: str) -> list[str]:
    return ["--cluster", str(REPLAY_TOML), "--trace", "unused", "--model-map", MAP,
            "--workflows", "8", "--priors-from-trace", "--out", str(out),
            *extra]


def _run(trace: Trace, profiles: Path, out: Path, policies: list[str], jobs: int = 1,
         costs: RouterCosts = NO_CHARGE, stock: bool = False,
         rate: str = "4") -> dict[str, Any]:
    a = build_parser(live=False).parse_args(_args(out, "--rates", rate, "--policies",
                                                  *policies))
    opts = replay_options(a, out)
    cfg = load_cluster_config(REPLAY_TOML)
    topts = TwinOptions(load_profiles(profiles, ["tiny-a", "tiny-b"]), costs, jobs=jobs,
                        stock=stock)
    return twin(cfg, trace, "tiny", opts, topts, "test")


def _records(out: Path) -> list[dict[str, Any]]:
    return read_jsonl(out / "requests.jsonl")


def test_a_twin_replay_repeats_exactly_in_this_and_in_other_processes(
        trace: Trace, profiles: Path, tmp_path: Path) -> None:
    policies = ["round_robin", "lmetric:fcfs"]
    _run(trace, profiles, tmp_path / "one", policies)
    _run(trace, profiles, tmp_path / "two", policies, jobs=2)  # spawned processes
    one, two = _records(tmp_path / "one"), _records(tmp_path / "two")
    assert one == two and len(one) >= 8
    assert {r["policy"] for r in one} == set(policies)
    assert all(r["error"] is None and r["output_tokens"] == r["forced_tokens"] for r in one)
    rr = [r for r in one if r["policy"] == "round_robin"]
    assert {r["engine"] for r in rr} == {"tiny-a-0", "tiny-b-0"}
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    run = summary["runs"][0]["summary"]
    assert run["twin"]["virtual_s"] > 0 and run["errors"] == 0
    assert run["queue_s"]["n"] == run["calls"]  # every call reached an engine's queue
    mine = [r["queue_s"] for r in one if r["policy"] == summary["runs"][0]["policy"]]
    assert sum(mine) / len(mine) == pytest.approx(run["queue_s"]["mean"], abs=1e-12)
    with (tmp_path / "one" / "requests.csv").open(encoding="utf-8") as f:
        assert "queue_s" in next(csv.reader(f))
    assert summary["meta"]["twin"]["charge_decision"] is False


def test_stock_engines_in_a_twin_replay(trace: Trace, profiles: Path, tmp_path: Path) -> None:
    """With stock engines the router sees FCFS engines by their scrapes, so vLLM's balancer
    (which reads the view) routes otherwise than on hetserve's FCFS engines; every call
    is served and no engine goes down (scrapes are their heartbeats)."""
    patched = _run(trace, profiles, tmp_path / "patched", ["vllm:fcfs"], rate="40")
    stock = _run(trace, profiles, tmp_path / "stock", ["vllm:fcfs"], stock=True, rate="40")
    assert stock["meta"]["twin"]["stock"] and stock["meta"]["twin"]["scrape_interval_ms"] == 100
    assert patched["meta"]["twin"]["scrape_interval_ms"] is None
    run = stock["runs"][0]["summary"]
    assert run["errors"] == 0 and run["engine_down_events"] == 0
    one, two = _records(tmp_path / "patched"), _records(tmp_path / "stock")
    assert all(r["error"] is None for r in two) and len(one) == len(two)
    assert ([(r["engine"], r["end_s"]) for r in one]
            != [(r["engine"], r["end_s"]) for r in two])


def test_the_router_hears_every_engine_and_indexes_its_kv_blocks(
        trace: Trace, profiles: Path) -> None:
    sim, loop, router = replay_cluster(profiles, "lmetric")
    jobs = [Job("w0", trace.runs[0], 0.0)]
    body = stage_body(jobs[0], 1, 0, [], [], ClientSettings({"tiny-a": "small",
                                                             "tiny-b": "large"}))
    body["messages"][-1]["content"] = " ".join(f"fact {i} holds." for i in range(200))

    async def go() -> list[Any]:
        await router.start()
        first = await router.send(body)
        second = await router.send(body)
        await asyncio.sleep(3.0)  # idle: heartbeats keep both engines up
        await router.stop()
        return [first, second]

    try:
        first, second = loop.run_until_complete(go())
    finally:
        loop.close()
    stats = router.core.membership.stats
    assert stats.malformed_snapshot_frames == stats.malformed_kv_frames == 0
    assert all(c.snapshot_frames > 3 for c in stats.engines.values())
    assert stats.engine_down_events == 0
    assert first.error is None and second.error is None
    served = router.core.state.table[first.engine]
    assert len(served.kv) >= 2 and stats.engines[first.engine].kv_frames > 0  # 128-token blocks
    # lmetric routes on KV hits: the same prompt goes where its blocks are
    assert second.engine == first.engine
    record = sim.engines[second.engine].records["t2"]
    assert record.cached_tokens > 0


def test_charged_costs_delay_the_engine_by_exactly_that(trace: Trace, profiles: Path) -> None:
    ends = []
    for overhead in (0.0, 0.25):
        sim, loop, router = replay_cluster(profiles, "round_robin",
                                     RouterCosts(False, overhead))
        body = stage_body(Job("w0", trace.runs[0], 0.0), 1, 0, [], [],
                          ClientSettings({"tiny-a": "small", "tiny-b": "large"}))
        try:
            loop.run_until_complete(router.start())
            res = loop.run_until_complete(router.send(body))
            loop.run_until_complete(router.stop())
        finally:
            loop.close()
        assert res.error is None
        ends.append((res.first_token_s, res.end_s,
                     sim.engines[res.engine].records["t1"].arrival))
    (f0, e0, a0), (f1, e1, a1) = ends
    assert (a0, a1) == (0.0, 0.25)
    assert f1 - f0 == pytest.approx(0.25, abs=1e-12) and e1 - e0 == pytest.approx(0.25,
                                                                                   abs=1e-12)


def test_a_refused_call_fails_alone_with_the_routers_error(trace: Trace,
                                                           profiles: Path) -> None:
    _, loop, router = replay_cluster(profiles, "round_robin")
    body = stage_body(Job("w0", trace.runs[0], 0.0), 1, 0, [], [],
                      ClientSettings({"tiny-a": "small", "tiny-b": "large"}))
    bad = {**body, "per_model": {"max_tokens": {"nope": 3}}}
    try:
        loop.run_until_complete(router.start())
        res = loop.run_until_complete(router.send(bad))
        ok = loop.run_until_complete(router.send(body))
        loop.run_until_complete(router.stop())
    finally:
        loop.close()
    assert res.error is not None and res.error.startswith("HTTP 400") and "nope" in res.error
    assert ok.error is None


def test_a_loop_with_nothing_left_to_wait_for_says_so() -> None:
    loop = VirtualLoop(Simulator())
    try:
        with pytest.raises(Stuck):
            loop.run_until_complete(loop.create_future())
    finally:
        loop.close()


def test_calibration_formulas_and_refusals(tmp_path: Path) -> None:
    def row(engine: str, ttft: float, tpot: float, n: int = 11) -> RequestRecord:
        return RequestRecord("w0", "w0.1", 1, 0, 1, "solver", send_s=0.0, engine=engine,
                             first_token_s=ttft, end_s=ttft + tpot * (n - 1),
                             output_tokens=n)

    live = [row("a-0", 0.3, 0.02)] * 20 + [row("b-0", 0.5, 0.09)] * 20
    twin_rows = [row("a-0", 0.1, 0.01)] * 20 + [row("b-0", 0.1, 0.03)] * 21
    k = calibrate.slowdowns(live, twin_rows, ["a", "b"], {})
    assert k == pytest.approx({"a": 2.0, "b": 3.0})
    # a step from a run made with K = 2 for a: the correction multiplies it
    assert calibrate.slowdowns(live, twin_rows, ["a"], {"a": 2.0}) == pytest.approx({"a": 4.0})
    # medians: live 0.3 / 0.5 -> 0.4, twin 0.1 -> o = 0.3 (+ the 0.05 used)
    assert calibrate.request_overhead_s(live, twin_rows, 0.0) == pytest.approx(0.3)
    assert calibrate.request_overhead_s(live, twin_rows, 0.05) == pytest.approx(0.35)
    assert calibrate.request_overhead_s(twin_rows, live, 0.0) == 0.0
    with pytest.raises(ValueError, match="at least 20"):
        calibrate.slowdowns(live[:5], twin_rows, ["a"], {})
    assert calibrate.entry_of("tiny-b-10", ["tiny", "tiny-b"]) == "tiny-b"


def test_twin_command_errors_are_one_line(tmp_path: Path, profiles: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    path = write_trace(tmp_path / "fixture.jsonl", 4)
    argv = ["--cluster", str(REPLAY_TOML), "--trace", str(path), "--model-map", MAP,
            "--workflows", "2", "--out", str(tmp_path / "o"), "--policies", "round_robin"]
    with pytest.raises(SystemExit, match="no profile for engine"):
        twin_main([*argv, "--profiles", str(empty)])
    bad = tmp_path / "cal.json"
    bad.write_text('{"slowdown": 3}')
    with pytest.raises(SystemExit, match="not a calibration file"):
        twin_main([*argv, "--profiles", str(profiles), "--calibration", str(bad)])
    bad.write_text('{"slowdown": {"tiny-a": -1}, "request_overhead_ms": 5}')
    with pytest.raises(SystemExit, match=r"every slowdown in \(0, 1000\]"):
        twin_main([*argv, "--profiles", str(profiles), "--calibration", str(bad)])
    bad.write_text('{"slowdown": {"tiny-z": 2}, "request_overhead_ms": 5}')
    with pytest.raises(SystemExit, match="tiny-z are not in the cluster file"):
        twin_main([*argv, "--profiles", str(profiles), "--calibration", str(bad)])
    with pytest.raises(SystemExit):
        twin_main([*argv, "--profiles", str(profiles), "--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # repeats that would only repeat the first run
        twin_main([*argv, "--profiles", str(profiles), "--repeats", "2",
                   "--no-charge-decision"])
    assert "every repeat would be the first again" in capsys.readouterr().err


def test_validation_matches_within_the_interval_or_15_percent_and_checks_the_ranking(
        ) -> None:
    from kernels_bench.lab.replay.records import WorkflowRecord
    from kernels_bench.lab.twin import validate

    def runs(e2e: list[float], repeats: int = 2) -> list[tuple[dict[str, Any], list[Any]]]:
        summary = {"queue_s": {"mean": 0.1}, "ttft_s": {"mean": 0.2}, "tpot_s": {"mean": 0.01}}
        return [(summary, [WorkflowRecord(f"w{i}", "p", "solve", 1, 0.0, v + 0.01 * r)
                           for i, v in enumerate(e2e)]) for r in range(repeats)]

    fast, slow = [1.0, 1.2, 0.8, 1.1] * 5, [3.0, 3.3, 2.7, 3.1] * 5
    live = {("a", 1.0): runs(fast), ("b", 1.0): runs(slow)}
    twin_ok = {("a", 1.0): runs([v * 1.1 for v in fast]), ("b", 1.0): runs(slow)}
    out = validate.compare(live, twin_ok)
    assert [r["matches"] for r in out["rows"]] == [True, True]
    assert out["ranking"] == [{"rate": 1.0, "faster_live": "a", "slower_live": "b",
                               "same": True}]
    twin_bad = {("a", 1.0): runs([v * 4 for v in fast]), ("b", 1.0): runs(slow)}
    out = validate.compare(live, twin_bad)
    assert out["rows"][0]["matches"] is False and out["ranking"][0]["same"] is False
    assert "1 of 2" in validate.markdown(out) and "a < b @ 1/s" in validate.markdown(out)
    assert validate._exclusion("dir/chimera:stjf@3#2") == ("dir", "chimera:stjf", 3.0, 2)
