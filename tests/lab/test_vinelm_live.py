"""VineLM on real engines (builtin tiny models): ``kernels_bench vinelm collect`` executes every
trie node through the engines, each continuing from its parent's outputs, and resumes
without re-running anything; ``kernels_bench replay-vinelm`` serves workflows over the
recorded executions through a real router with the ``vinelm`` policy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernels_bench.lab.trace.suites import load_problems
from kernels_bench.lab.trace.workflows import stage_messages
from kernels_bench.lab.vinelm.executions import read_executions

pytestmark = pytest.mark.engine

MODELS = ("tiny-a", "tiny-b")
PROBLEMS = 2
ENGINE = """
[[engines]]
name = "{name}"
model = "builtin:{name}"
max_num_seqs = 4
max_model_len = 2048
dtype = "float32"
enforce_eager = true
seed = 0
kv_cache_bytes = 67108864
"""
CLUSTER = """
[router]
policy = "round_robin"

[router.policies.vinelm]
prompt_cost_per_1k = { tiny-a = 0.01, tiny-b = 0.03 }
output_cost_per_1k = { tiny-a = 0.02, tiny-b = 0.06 }
decode_ms_per_token = { tiny-a = 3.0, tiny-b = 20.0 }
max_batch_size = { tiny-a = 4, tiny-b = 4 }
fallback = "lmetric"

[router.policies.vinelm.workflows.math]
stages = [
  { name = "planner", models = ["tiny-a", "tiny-b"] },
  { name = "solver", models = ["tiny-b"], answers = true },
]

[launcher]
base_port = 18750
""" + "".join(ENGINE.format(name=m) for m in MODELS)


def _run(argv: list[str], log: Path, run_root: Path) -> int:
    env = {**os.environ, "TMPDIR": str(run_root), "HF_HUB_OFFLINE": "1"}
    with log.open("ab") as f:
        return subprocess.run([sys.executable, "-m", *argv], env=env, stdout=f,
                              stderr=subprocess.STDOUT, timeout=900).returncode


@pytest.fixture(scope="module")
def collected() -> Iterator[tuple[Path, Path]]:
    """(work folder, executions file) after one collection."""
    work = Path(tempfile.mkdtemp(prefix="hsv-"))  # short: ipc:// socket paths are limited
    (work / "cluster.toml").write_text(CLUSTER)
    out = work / "ex.jsonl.gz"
    argv = ["kernels_bench", "vinelm", "collect", "--config", str(work / "cluster.toml"),
            "--workflow", "math", "--suite", "math", "--problems", str(PROBLEMS),
            "--max-tokens", "24", "--out", str(out)]
    assert _run(argv, work / "collect.log", work) == 0, (work / "collect.log").read_text()[-3000:]
    yield work, out
    shutil.rmtree(work, ignore_errors=True)


def test_collect_runs_every_node_from_its_parents_outputs(collected: tuple[Path, Path]) -> None:
    work, out = collected
    header, table = read_executions(out)
    assert header.workflow == "math" and header.signature[1] == ["solver", ["tiny-b"]]
    # the random tiny models never answer right: every node of both problems runs (the
    # solver on tiny-b alone: one engine start fewer, and the reuse below still shows)
    assert len(table) == PROBLEMS * (2 + 2)
    assert all(e.source == "engine" and not e.success for e in table.values())
    problems = {p.id: p for p in load_problems("math", PROBLEMS, 0)}
    for (problem, prefix), e in table.items():
        role = ("planner", "solver")[len(prefix) - 1]
        assert e.stage.role == role and 0 < e.stage.output_tokens <= 24
        # a node continues from its own parent's output (checkpoint reuse)
        history = [("planner", table[problem, prefix[:1]].stage.output_text)] if len(
            prefix) == 2 else []
        assert e.stage.messages == stage_messages("math", role, problems[problem].text,
                                                  history)
    log = (work / "collect.log").read_text()
    assert "depth 2 solver tiny-b: 100%|" in log
    # one engine at a time: tiny-a, tiny-b for depth 1; depth 2 runs on the running tiny-b
    assert log.count("starting engine") == 2

    # a second collection finds nothing to do and starts no engine
    assert _run(["kernels_bench", "vinelm", "collect", "--config", str(work / "cluster.toml"),
                 "--workflow", "math", "--suite", "math", "--problems", str(PROBLEMS),
                 "--max-tokens", "24", "--out", str(out)], work / "again.log", work) == 0
    assert "starting engine" not in (work / "again.log").read_text()
    assert read_executions(out)[1] == table


def test_replay_vinelm_serves_recorded_workflows(collected: tuple[Path, Path]) -> None:
    work, executions = collected
    cluster = work / "replay.toml"
    cluster.write_text(CLUSTER.replace("18750", "18770").replace(
        'policy = "round_robin"', 'policy = "vinelm"\nport = 18790\nheartbeat_timeout_s = 10.0'))
    out = work / "replay"
    argv = ["kernels_bench", "replay-vinelm", "--cluster", str(cluster), "--executions",
            str(executions), "--vinelm-config", str(work / "cluster.toml"), "--model-map",
            "tiny-a=tiny-a,tiny-b=tiny-b", "--variants", "vinelm", "static", "--slos", "30",
            # 2 problems: 4 cascades each so that profiling sees every (stage, model)
            "--cascades", "4",
            "--workflows", "4", "--rate", "2", "--out", str(out)]
    assert _run(argv, work / "replay.log", work) == 0, (work / "replay.log").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["calibration"]) == set(MODELS)
    assert all(c["b"] > 0 for c in summary["calibration"].values())
    runs = {r["variant"]: r for r in summary["runs"]}
    assert set(runs) == {"vinelm", "static"}
    for r in runs.values():
        assert r["errors"] == 0 and r["workflows"] == 4 and r["accuracy"] == 0.0
        # nothing succeeds, so every workflow makes both calls
        assert sum(r["calls_per_model"].values()) == 8
    static = runs["static"]["static_path"]
    assert runs["static"]["calls_per_model"] == {m: 4 * static.count(m) for m in set(static)}
    rows = [json.loads(line) for line in (out / "workflows.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(len(r["models"]) == 2 for r in rows)
