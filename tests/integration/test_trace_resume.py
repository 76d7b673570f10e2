"""The trace builder on a real engine (builtin:tiny-a): killed mid-build, then resumed, it
ends with every unit exactly once and keeps the units written before the kill; with
``--samples K`` on the finished trace it adds K sampled runs per unit, each with its own
seed, and runs nothing else. One build killed, resumed, then sampled: three engine starts."""

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


def _build(tmp_path: Path, out: Path, run_root: Path, *extra: str,
           problems: int = PROBLEMS) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kernels_bench", "trace", "build", "--cluster",
            str(tmp_path / "cluster.toml"), "--suite", "math", "--problems", str(problems),
            "--out", str(out), "--max-tokens", "48", "--concurrency", "1", *extra]
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
    first = _build(tmp_path, out, run_root)
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

    second = _build(tmp_path, out, run_root)
    assert second.wait(timeout=600) == 0, log.read_text()[-3000:]
    after = _units(out)
    keys = [u.key for u in after]
    assert len(keys) == len(set(keys)) == total
    assert after[: len(before)] == before
    assert f"{len(before)}/{total} units done, {total - len(before)} to run" in log.read_text()
    assert "math tiny-a: 100%|" in log.read_text()  # the progress bar of the resumed run

    # --samples 2 on two problems of one workflow: two seeded runs beside each greedy one,
    # and only those run
    args = ("--workflows", "solve", "--concurrency", "4")
    third = _build(tmp_path, out, run_root, *args, "--samples", "2", problems=2)
    assert third.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert "2/6 units (greedy + 2 samples each) done, 4 to run" in log.read_text()
    header, sampled = read_records(out)
    assert sampled[:total] == after
    assert header.settings["sampling"] == {"temperature": 0.7, "top_p": 0.95}
    assert header.settings["temperature"] == 0.0
    added = sampled[total:]
    assert sorted((u.problem_id, u.sample) for u in added) == [
        (p, k) for p in ("gsm_symbolic/0/0", "gsm_symbolic/0/1") for k in (0, 1)]
    for u in added:
        assert u.workflow == "solve"
        assert u.seed == sample_seed(0, u.problem_id, "solve", "tiny-a", u.sample)
    texts = {u.sample: u.stages[0].output_text for u in sampled
             if u.problem_id == "gsm_symbolic/0/0" and u.workflow == "solve"}
    assert len(set(texts.values())) == 3  # greedy and two samples of a random model differ
