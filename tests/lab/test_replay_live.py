"""The serving replay for real: examples/replay.toml's two built-in engines started
through the launcher API, the tiny fixture trace, Chimera on predictors trained on it
(``kernels_bench artifacts``, small settings, cross-fitted in two folds), vLLM's balancer
and the oracle on the same STJF engines (one engine start keeps it short), a handful of
held-out workflows per fold, one retry for wrong answers. Metric arithmetic on a
hand-made schedule is in tests/unit.

    .venv/bin/python -m pytest tests/lab/test_replay_live.py -m engine -v
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels_bench.lab.commands import replay as cli
from kernels_bench.lab.commands import results
from kernels_bench.lab.replay import artifacts
from kernels_bench.lab.replay.workload import remaining_tokens
from router.predictors.records import Split
from router.trace_format import load_trace
from tests.replay_fixture import write_trace

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
MAP = {"tiny-a": "small", "tiny-b": "large"}


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_replay_end_to_end(tmp_path: Path) -> None:
    trace_path = write_trace(tmp_path / "trace.jsonl", problems=8)
    splits = [Split.fold(0, k, 2) for k in range(2)]
    for k, split in enumerate(splits):
        trained = artifacts.build(
            ["semantic_router", "length"], [str(trace_path)], ["tiny-a=small,tiny-b=large"],
            artifacts.fold_dir(tmp_path / "artifacts", k), split, progress=False,
            sets=["semantic_router.epochs=1", "length.svd_components=2",
                  "length.n_estimators=10"])
        assert trained == {"semantic_router": "trained", "length": "trained"}
    out = tmp_path / "out"
    cli.main(["--cluster", str(ROOT / "examples" / "replay.toml"), "--trace", str(trace_path),
              "--policies", "chimera:stjf", "vllm", "oracle", "--baseline", "vllm", "--rates", "4",
              "--workflows", "3", "--model-map", "tiny-a=small,tiny-b=large", "--retries", "1",
              "--artifacts", str(tmp_path / "artifacts"), "--out", str(out)])

    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["held_out_splits"] == [
        {"seed": 0, "fraction": 0.5, "start": 0.0}, {"seed": 0, "fraction": 0.5, "start": 0.5}]
    for label in ("chimera:stjf", "oracle"):  # routed on the trained artifacts
        assert summary["meta"]["inputs"][label]["predictors"] == ["length", "semantic_router"]
    assert summary["meta"]["inputs"]["vllm"]["predictors"] == []
    assert [(r["policy"], r["fold"]) for r in summary["runs"]] == [  # one engine start
        ("chimera:stjf", 0), ("vllm", 0), ("oracle", 0),
        ("vllm", 1), ("oracle", 1), ("chimera:stjf", 1)]
    for run in summary["runs"]:
        s = run["summary"]
        assert s["errors"] == 0 and s["workflows"] == 3 and s["engine_down_events"] == 0, run
        assert s["e2e_s"]["mean"] > 0 and s["queue_s"]["n"] >= s["calls"]
        assert abs(sum(v["calls"] for v in s["traffic"].values()) - 1) < 1e-9
        assert s["router"]["cpu_s"] > 0
        assert run["block_sizes"] == {"tiny-a-0": 128, "tiny-b-0": 128}  # vLLM's on CPU

    trace = load_trace(trace_path)
    runs = {(r.problem_id, r.workflow): r for r in trace.runs}
    workflows = {(w["policy"], w["job_id"]): w for w in rows(out / "workflows.jsonl")}
    # every workflow on a problem the predictors of its fold never saw; both folds replayed
    assert all(splits[w["fold"]].holds_out(w["problem_id"]) for w in workflows.values())
    assert {w["fold"] for w in workflows.values()} == {0, 1}
    calls = rows(out / "requests.jsonl")
    assert len(calls) == sum(w["num_stages"] * w["attempts"] for w in workflows.values())
    for c in calls:
        w = workflows[(c["policy"], c["job_id"])]
        run = runs[(w["problem_id"], w["workflow"])]
        traced = MAP[c["model"]]
        # the engine generated exactly the trace's length for the model the router chose
        want = run.models[traced].stages[c["stage_index"]].output_tokens
        assert c["trace_model"] == traced and c["output_tokens"] == c["forced_tokens"] == want
        if c["policy"] == "oracle":  # true remaining tokens of the chosen model
            assert c["priority"] == remaining_tokens(run, traced, c["stage_index"])
        elif c["policy"] == "chimera:stjf":  # STJF priority = predicted remaining tokens
            assert c["priority"] == round(c["predicted_remaining_tokens"])
        else:
            assert c["priority"] is None
    for run_ in summary["runs"]:
        mine = [c for c in calls if (c["policy"], c["fold"]) == (run_["policy"], run_["fold"])]
        # engine side: vLLM's own count of generated tokens
        generated = sum(e["generation_tokens"] for e in run_["engines"].values())
        assert generated == sum(c["output_tokens"] for c in mine)
        # the router's decisions (its histogram over the run) are each made inside one of
        # the run's calls, before its first token: none longer than the longest such wait
        longest = max((c["end_s"] if c["first_token_s"] is None else c["first_token_s"])
                      - c["send_s"] for c in mine)
        router = run_["summary"]["router"]
        assert 0 < router["decision_s_mean"] <= longest, (router, longest)

    retried = 0
    for (policy, job_id), w in workflows.items():
        run = runs[(w["problem_id"], w["workflow"])]
        verdicts = [run.models[MAP[m]].correct for m in w["final_models"]]
        # an attempt follows a wrong one, up to 2 attempts; the last one decides
        assert len(verdicts) == w["attempts"] and not any(verdicts[:-1])
        assert w["attempts"] == 2 or verdicts[-1]
        assert w["correct"] == verdicts[-1] and (w["ttca_s"] is not None) == w["correct"]
        mine = [c for c in calls if (c["policy"], c["job_id"]) == (policy, job_id)]
        assert sorted({c["program_id"] for c in mine}) == [
            f"{job_id}.{a}" for a in range(1, w["attempts"] + 1)]
        assert len(mine) == w["attempts"] * w["num_stages"]
        retried += w["attempts"] - 1
    # the fast tiny-a replays 'small', wrong on odd problems: some attempt must have failed
    assert retried > 0, "no workflow was retried: the retry path was not exercised"

    page = tmp_path / "docs" / "results.md"
    tuned = sorted({w["problem_id"] for w in workflows.values()})[:1]
    (tmp_path / "tuned.json").write_text(json.dumps(tuned))
    results.main(["--run", str(out), "--out", str(page), "--exclude-problems",
                  str(tmp_path / "tuned.json")])
    text = page.read_text()
    kept = sum(w["problem_id"] not in tuned for w in workflows.values())
    assert "## Without the problems of `tuned.json`" in text
    assert f"(1 replayed problems left out; {kept} of {len(workflows)} workflow" in text
    assert "| chimera:stjf | 4 |" in text and "Ratios against `vllm`" in text
    assert "cross-fitted over 2 folds" in text and "| chimera:stjf f1 | 4 |" in text
    assert (tmp_path / "docs" / "results" / "frontier.png").exists()
    assert str(tmp_path) not in text  # no path of this machine in the page
