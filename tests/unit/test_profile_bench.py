"""The profile's arithmetic: decode step samples from telemetry, the profile numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_ext.telemetry import SchedulerSnapshot
from kernels_bench.predictors.profile import (Cell, decode_samples, default_batches, fit_line,
                                         profile_numbers, write_outputs)
from router.predictors.loader import load_profiles


def snap(seq: int, ts: float, step: int, batch: int, waiting: int = 0, prefill: int = 0,
         heartbeat: bool = False) -> SchedulerSnapshot:
    return SchedulerSnapshot(engine_id="e-0", seq=seq, ts=ts, step=step, batch_size=batch,
                             num_waiting=waiting, queued_prefill_tokens=prefill,
                             pending_decode_tokens=0, kv_usage=0.1, num_preemptions=0,
                             heartbeat=heartbeat)


def test_decode_samples_keep_pure_decode_intervals_only() -> None:
    snaps = [
        snap(0, 10.000, 0, 4, prefill=300),   # prefill still queued
        snap(1, 10.020, 4, 4),
        snap(2, 10.040, 9, 4),                # 5 steps in 20 ms -> 4 ms
        snap(3, 10.070, 15, 4),               # 6 steps in 30 ms -> 5 ms
        snap(5, 10.100, 20, 4),               # frame 4 lost: skipped
        snap(6, 10.120, 24, 3),               # batch changed
        snap(7, 10.140, 28, 4, waiting=1),    # something waiting
        snap(8, 11.140, 28, 4, heartbeat=True),
    ]
    assert decode_samples(snaps, 4) == pytest.approx([4.0, 5.0])
    assert decode_samples(snaps, 2) == []


def cells() -> list[Cell]:
    return [Cell(b, c, ms, ms, ms, 10) for b, c, ms in
            ((1, 128, 3.0), (4, 128, 3.5), (8, 128, 4.0),
             (1, 512, 3.2), (4, 512, 3.8), (8, 512, 5.0))]


def test_profile_numbers() -> None:
    # KV room for 8 sequences of 512 + 128 tokens: full batch at the 512 context
    assert profile_numbers(cells(), 8, 8 * 640, 512, 128) == (5.0, 8, 512)
    # KV room for only 5: the largest measured batch <= 5 is 4
    assert profile_numbers(cells(), 8, 5 * 640, 500, 128) == (3.8, 5, 512)
    assert profile_numbers(cells(), 8, 10**6, 100, 128) == (4.0, 8, 128)
    assert Cell(8, 128, 4.0, 4.0, 4.0, 1).tokens_per_s == 2000.0


def test_fit_line_and_batches() -> None:
    slope, intercept = fit_line([100, 200, 400], [12.0, 22.0, 42.0])
    assert slope == pytest.approx(0.1) and intercept == pytest.approx(2.0)
    assert default_batches(8) == [1, 2, 4, 8]
    assert default_batches(12) == [1, 2, 4, 8, 12]
    assert default_batches(1) == [1]


def test_profiles_file_is_what_the_router_loads(tmp_path: Path) -> None:
    result = {"engine": "tiny-a-0", "served_model_name": "tiny-a", "decode_ms_per_token": 3.5,
              "max_batch_size": 8, "mean_output_tokens": 70.0, "prefill_ms_per_token": 0.1,
              "prefill_fixed_ms": 5.0, "decode_curve": [
                  {"batch_size": 1, "context_tokens": 128, "step_ms": 3.0,
                   "tokens_per_s": 333.0, "samples": 9}],
              "prefill_curve": [{"context_tokens": 128, "ms": 17.8}]}
    write_outputs(tmp_path, {"tiny-a": result})
    assert json.loads((tmp_path / "tiny-a.json").read_text())["decode_curve"]
    profiles = load_profiles(str(tmp_path / "profiles.json"), ["tiny-a"])
    assert profiles["tiny-a"].decode_ms_per_token == 3.5
    assert profiles["tiny-a"].max_batch_size == 8
    assert profiles["tiny-a"].mean_output_tokens == 70.0
    assert (tmp_path / "profile.png").stat().st_size > 0


def test_router_loads_the_profiles_named_in_the_cluster_file(tmp_path: Path) -> None:
    from router.config.cluster import load_cluster_config
    from router.dispatch.core import RouterCore
    from router.predictors.loader import load_cluster_predictors

    (tmp_path / "profiles.json").write_text(json.dumps({
        "tiny-a": {"decode_ms_per_token": 3.5, "max_batch_size": 8},
        "tiny-b": {"decode_ms_per_token": 20.0, "max_batch_size": 4}}))
    engines = "".join(
        f'[[engines]]\nname = "{m}"\nmodel = "builtin:{m}"\nport = {port}\n'
        f'telemetry_endpoint = "ipc://{tmp_path}/{m}.t"\n'
        f'kv_events_endpoint = "ipc://{tmp_path}/{m}.k"\n'
        for m, port in (("tiny-a", 9301), ("tiny-b", 9302)))
    (tmp_path / "c.toml").write_text(
        '[router]\npolicy = "chimera"\nport = 9300\n'
        '[router.predictors]\nprofiles = "profiles.json"\n'
        '[router.policies.chimera]\nstatic_prior = true\n'
        'confidence = { tiny-a = 0.5, tiny-b = 0.9 }\n'
        'mean_output_tokens = { tiny-a = 50, tiny-b = 60 }\n' + engines)
    cfg = load_cluster_config(tmp_path / "c.toml")
    policy = RouterCore(cfg, load_cluster_predictors(cfg, service=None)).build_policy()
    assert policy.sources["profile"] == "predictor"
    assert policy.decode_ms == {"tiny-a": 3.5, "tiny-b": 20.0}  # type: ignore[attr-defined]
    assert policy.max_batch == {"tiny-a": 8, "tiny-b": 4}  # type: ignore[attr-defined]
