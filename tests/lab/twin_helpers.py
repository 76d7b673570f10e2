"""Shared builders of the twin tests: profiles, engine specs, a run of the replay cluster."""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import astuple
from pathlib import Path
from typing import Any

import msgspec

from kernels_bench.lab.twin.engine_spec import EngineSpec, engine_specs
from kernels_bench.lab.twin.loop import VirtualLoop
from kernels_bench.lab.twin.router import RouterCosts, TwinRouter
from kernels_bench.lab.twin.run import run_config
from kernels_bench.lab.twin.sim import Simulator
from kernels_bench.lab.twin.speed import synthetic_workload
from kernels_bench.lab.twin.step_time import EngineProfile, StepTimeModel, load_profile
from router.config.cluster import load_cluster_config

REPLAY_TOML = Path(__file__).resolve().parents[2] / "examples" / "replay.toml"
NO_CHARGE = RouterCosts(charge_decision=False)


def replay_cluster(profiles: Path, policy: str, costs: RouterCosts = NO_CHARGE
                   ) -> tuple[Simulator, VirtualLoop, TwinRouter]:
    """The replay cluster (``REPLAY_TOML``) in the twin under ``policy``: its engines on
    ``profiles`` (telemetry on), the virtual loop and the twin's router."""
    cfg = load_cluster_config(REPLAY_TOML)
    cfg = run_config(cfg, cfg.engines, dataclasses.replace(cfg.router, policy=policy))
    sim = Simulator()
    for spec in engine_specs(cfg):
        sim.add_engine(spec, StepTimeModel(load_profile(profiles / f"{spec.entry}.json")),
                       telemetry=True)
    loop = VirtualLoop(sim)
    return sim, loop, TwinRouter(cfg, loop, None, costs)


def profile_dict(cells: list[tuple[int, int, float, float, float]], prefill_ms_per_token: float,
                 decode_tokens: int = 128) -> dict[str, Any]:
    """A profile in the format ``kernels_bench profile`` writes: cells are
    (batch, context, step_ms, p10, p90)."""
    return {"decode_curve": [{"batch_size": b, "context_tokens": c, "step_ms": ms,
                              "step_ms_p10": p10, "step_ms_p90": p90, "samples": 5}
                             for b, c, ms, p10, p90 in cells],
            "decode_tokens": decode_tokens, "prefill_ms_per_token": prefill_ms_per_token,
            "prefill_fixed_ms": 12.0, "max_num_seqs": 8}


def write_profile(path: Path, cells: list[tuple[int, int, float, float, float]],
                  prefill_ms_per_token: float) -> EngineProfile:
    """Writes the profile file and reads it back as the twin does."""
    path.write_text(json.dumps(profile_dict(cells, prefill_ms_per_token)))
    return load_profile(path)


def flat_spec(name: str, policy: str, *, max_num_seqs: int = 8,
              max_num_batched_tokens: int = 256, block_size: int = 16,
              num_blocks: int = 1000) -> EngineSpec:
    return EngineSpec(name=name, entry=name.rsplit("-", 1)[0], served_model_name="m",
                      sched_policy=policy, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens, max_model_len=4096,
                      block_size=block_size, num_blocks=num_blocks)


REPLAY_PROFILES = {
    # (batch, context, step_ms, p10, p90). Context 128: the decode speeds measured in
    # engine_ext/builtin_models.py (1 and 8 streams); the rest is assumed, CPU-like.
    "tiny-a": ([(1, 128, 3.3, 3.0, 3.9), (8, 128, 4.8, 4.2, 5.9),
                (1, 2048, 4.1, 3.7, 4.8), (8, 2048, 7.5, 6.6, 9.0)], 0.02),
    "tiny-b": ([(1, 128, 11.4, 10.5, 13.0), (8, 128, 16.2, 14.8, 19.0),
                (1, 2048, 13.0, 12.0, 15.0), (8, 2048, 24.0, 21.5, 28.0)], 0.09),
}


def write_replay_profiles(folder: Path) -> Path:
    """``REPLAY_PROFILES`` as profile files ``<entry>.json`` in ``folder``."""
    for entry, (cells, prefill) in REPLAY_PROFILES.items():
        write_profile(folder / f"{entry}.json", cells, prefill)
    return folder


def replay_records(seed: int, jitter_seed: int, n: int = 60) -> list[tuple[Any, ...]]:
    """The replay cluster's two engines under ``synthetic_workload(seed, n)``, jitter on: every
    request's record, in finishing order."""
    sim = Simulator()
    for spec in engine_specs(load_cluster_config(REPLAY_TOML)):
        cells, prefill = REPLAY_PROFILES[spec.entry]
        profile = msgspec.convert(profile_dict(cells, prefill), EngineProfile)
        sim.add_engine(spec, StepTimeModel(profile, jitter=True,
                                           seed=zlib.crc32(f"{jitter_seed}/{spec.name}".encode())))
    finished: list[tuple[Any, ...]] = []
    sim.on_finish(lambda r: finished.append(astuple(r)))
    for at, engine, request in synthetic_workload(seed, n, sorted(sim.engines)):
        sim.submit(engine, request, at)
    sim.run()
    return finished
