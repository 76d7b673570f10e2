"""``python -m kernels_bench profile`` on a real engine (built-in ``tiny-a``, started
through the launcher API): the decode cells come from the engine's telemetry, the
prefill points from timed requests, and the outputs are the files the router loads.
``kernels_bench artifacts --profile`` then takes that profile as done (one engine start
for both): the TPOT heads train on its telemetry and answer for the engine, and a second
call keeps both. Profiling inside ``artifacts`` (and a profile cut short):
tests/lab/test_artifacts_cache.py.

    .venv/bin/python -m pytest tests/integration/test_profile.py -m engine -v
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernels_bench.commands import profile as profile_command
from kernels_bench.lab.replay import artifacts
from router.predictors.base import TpotQuery
from router.predictors.tpot import TpotHeads
from tests.replay_fixture import write_trace

pytestmark = pytest.mark.engine

CLUSTER = """\
[router]
policy = "round_robin"

[[engines]]
name = "tiny-a"
model = "builtin:tiny-a"
max_num_seqs = 4
max_model_len = 512
dtype = "float32"
enforce_eager = true
kv_cache_bytes = 67108864
"""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder for the engine's ipc:// sockets (paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="hs-prof-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_profile_of_a_tiny_engine_then_its_tpot_heads(tmp_path: Path, short_dir: Path) -> None:
    cluster, art = tmp_path / "c.toml", tmp_path / "art"
    cluster.write_text(CLUSTER)
    trace = write_trace(tmp_path / "trace.jsonl")
    out = art / "profile"  # where `kernels_bench artifacts --out art` looks for it
    profile_command.main(["--cluster", str(tmp_path / "c.toml"), "--batch-sizes", "1", "4",
                        "--contexts", "64", "256", "--decode-tokens", "96",
                        "--reference-context", "200", "--trace", str(trace),
                        "--model-map", "tiny-a=small", "--out", str(out),
                        "--run-dir", str(short_dir)])

    r = json.loads((out / "tiny-a.json").read_text())
    cells = {(c["batch_size"], c["context_tokens"]): c for c in r["decode_curve"]}
    assert set(cells) == {(1, 64), (4, 64), (1, 256), (4, 256)} and not r["skipped"]
    for c in cells.values():  # every cell measured from pure decode intervals
        assert c["samples"] >= 1 and 0 < c["step_ms_p10"] <= c["step_ms"] <= c["step_ms_p90"]
        assert c["tokens_per_s"] == pytest.approx(c["batch_size"] * 1000 / c["step_ms"])
    # full batch at the measured context nearest the reference: Chimera's L[m]
    assert r["max_batch_size"] == 4 and r["reference_context"] == 256
    assert r["decode_ms_per_token"] == cells[(4, 256)]["step_ms"]
    assert r["kv_capacity_tokens"] >= 4 * (256 + 96)
    assert [p["context_tokens"] for p in r["prefill_curve"]] == [64, 256]
    assert all(p["ms"] > 0 for p in r["prefill_curve"])
    xs = [p["context_tokens"] for p in r["prefill_curve"]]
    slope, _ = np.polyfit(xs, [p["ms"] for p in r["prefill_curve"]], 1)
    assert r["prefill_ms_per_token"] == pytest.approx(slope)

    profiles = json.loads((out / "profiles.json").read_text())
    small = [10 + 2 * p + s for p in range(4) for s in (0, 1)] + [10 + 2 * p for p in range(4)]
    assert profiles == {"tiny-a": {"decode_ms_per_token": r["decode_ms_per_token"],
                                   "max_batch_size": 4,
                                   "mean_output_tokens": pytest.approx(np.mean(small))}}
    with gzip.open(out / "telemetry.jsonl.gz", "rt") as f:
        snaps = [json.loads(line) for line in f]
    assert snaps and {s["engine_id"] for s in snaps} == {"tiny-a-0"}
    assert max(s["batch_size"] for s in snaps) == 4
    assert (out / "profile.png").stat().st_size > 0

    status = artifacts.build_tpot(cluster, art, [], progress=False, run_dir=short_dir)
    assert status == {"profile": "up to date", "tpot": "trained"}  # the profile above
    heads = TpotHeads.load(art / "tpot")
    assert heads.engines == frozenset({"tiny-a-0"})  # the engine id the replay's router sees
    (ms,) = heads.tpot_ms([TpotQuery("tiny-a-0", 1, 100, 128, 0.1)])
    assert math.isfinite(ms) and ms > 0
    again = artifacts.build_tpot(cluster, art, [], progress=False, run_dir=short_dir)
    assert again == {"profile": "up to date", "tpot": "up to date"}
