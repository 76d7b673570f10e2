"""``kernels_bench artifacts --profile`` on a real engine (built-in ``tiny-a``): the profile
runs once, the TPOT heads train on its telemetry and answer for the engine, and a second
call keeps both.

    .venv/bin/python -m pytest tests/integration/test_artifacts_profile.py -m engine -v
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernels_bench import artifacts
from router.predictors.base import TpotQuery
from router.predictors.tpot import TpotHeads

pytestmark = pytest.mark.engine

CLUSTER = """\
[router]
policy = "round_robin"

[[engines]]
name = "tiny-a"
model = "builtin:tiny-a"
max_num_seqs = 2
max_model_len = 512
dtype = "float32"
enforce_eager = true
kv_cache_bytes = 67108864
"""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder for the engine's ipc:// sockets (paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="hs-art-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_profile_then_tpot_heads(tmp_path: Path, short_dir: Path) -> None:
    cluster, out = tmp_path / "c.toml", tmp_path / "art"
    cluster.write_text(CLUSTER)
    status = artifacts.build_tpot(cluster, out, [], progress=False, run_dir=short_dir)
    assert status == {"profile": "profiled", "tpot": "trained"}
    assert (out / "profile" / "profiles.json").is_file()
    heads = TpotHeads.load(out / "tpot")
    assert heads.engines == frozenset({"tiny-a-0"})  # the engine id the replay's router sees
    (ms,) = heads.tpot_ms([TpotQuery("tiny-a-0", 1, 100, 128, 0.1)])
    assert math.isfinite(ms) and ms > 0
    again = artifacts.build_tpot(cluster, out, [], progress=False, run_dir=short_dir)
    assert again == {"profile": "up to date", "tpot": "up to date"}
