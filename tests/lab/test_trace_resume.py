"""The trace builder on a real engine (builtin:tiny-a): killed mid-build, then resumed with
``--samples K``, it ends with every greedy unit exactly once, keeps the units written
before the kill, and adds K sampled runs per unit, each with its own seed. One build
killed, then resumed with samples: two engine starts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from launcher.process import MARKER_ENV
from router.trace_format import read_records, sample_seed

pytestmark = pytest.mark.engine

PROBLEMS = 4
WORKFLOWS = 3
CLUSTER = """
[router]
policy = "round_robin"

[[engines]]
name = "tiny-a"
model = "builtin:tiny-a"
max_num_seqs = 4
max_model_len = 2048
dtype = "float32"
enforce_eager = true
seed = 0
kv_cache_bytes = 67108864

[launcher]
base_port = 18700
"""


def _build(tmp_path: Path, out: Path, run_root: Path, *extra: str
           ) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kernels_bench", "trace", "build", "--cluster",
            str(tmp_path / "cluster.toml"), "--suite", "math", "--problems", str(PROBLEMS),
            "--out", str(out), "--max-tokens", "48", *extra]
    env = {**os.environ, "TMPDIR": str(run_root), "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "build.log").open("ab")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _units(out: Path) -> list:
    try:
        return read_records(out)[1]
    except (OSError, ValueError):
        return []


def _kill_leftover_engines(run_root: Path) -> None:
    """Kill the engines the killed builder started (their run dirs are under ``run_root``)
    and wait until they are gone, so the next engine finds its port free. Scans again
    until none is left: an engine server killed while starting may spawn its EngineCore
    after the scan (an orphaned EngineCore was once found an hour after a test run)."""
    for _ in range(10):
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER_ENV, "").startswith(str(run_root)):
                    p.kill()
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        if not found:
            return
        psutil.wait_procs(found, timeout=30)
        time.sleep(0.5)


@pytest.fixture
def run_root() -> Iterator[Path]:
    """A short folder for the engines' run dirs (ipc:// socket paths are limited)."""
    root = Path(tempfile.mkdtemp(prefix="hst-"))
    yield root
    _kill_leftover_engines(root)
    shutil.rmtree(root, ignore_errors=True)


def test_a_killed_build_resumes_and_samples_are_added_beside_its_greedy_runs(
        tmp_path: Path, run_root: Path) -> None:
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    out = tmp_path / "trace.jsonl.gz"
    log = tmp_path / "build.log"
    total = PROBLEMS * WORKFLOWS
    first = _build(tmp_path, out, run_root, "--concurrency", "1")
    try:
        deadline = time.monotonic() + 400
        while len(_units(out)) < 3:
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no units written"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        _kill_leftover_engines(run_root)
    before = _units(out)
    assert 3 <= len(before) < total, "the kill came too late to test resumption"

    samples = 2
    second = _build(tmp_path, out, run_root, "--samples", str(samples), "--concurrency", "4")
    assert second.wait(timeout=600) == 0, log.read_text()[-3000:]
    runs = total * (1 + samples)
    assert (f"{len(before)}/{runs} units (greedy + {samples} samples each) done, "
            f"{runs - len(before)} to run") in log.read_text()
    assert "math tiny-a: 100%|" in log.read_text()  # the progress bar of the resumed run
    header, units = read_records(out)
    assert units[: len(before)] == before  # nothing written before the kill is run again
    greedy = [u for u in units if u.sample is None]
    assert len({u.key for u in greedy}) == len(greedy) == total
    assert header.settings["sampling"] == {"temperature": 0.7, "top_p": 0.95}
    assert header.settings["temperature"] == 0.0
    sampled = [u for u in units if u.sample is not None]
    assert sorted((u.problem_id, u.workflow, u.sample) for u in sampled) == sorted(
        (u.problem_id, u.workflow, k) for u in greedy for k in range(samples))
    for u in sampled:
        assert u.seed == sample_seed(0, u.problem_id, u.workflow, "tiny-a", u.sample)
    texts = {u.sample: u.stages[0].output_text for u in units
             if u.problem_id == "gsm_symbolic/0/0" and u.workflow == "solve"}
    assert len(set(texts.values())) == 3  # greedy and two samples of a random model differ
