"""Replay metrics on a hand-made schedule, engine counters, the summary tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernels_bench.lab.replay.metrics import distribution, summarize, tpot, ttft
from kernels_bench.lab.replay.output import write_run, write_summary
from kernels_bench.lab.replay.records import RequestRecord, WorkflowRecord
from kernels_bench.lab.replay.report import flat_rows, markdown_tables
from kernels_bench.lib import engine_metrics as em


def call(job: str, stage: int, model: str, send: float, first: float | None, end: float,
         out: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(job_id=job, program_id=f"{job}.1", attempt=1, stage_index=stage,
                         num_stages=2, role="r", send_s=send, first_token_s=first, end_s=end,
                         model=model, engine=f"{model}-0", trace_model=model, forced_tokens=out,
                         output_tokens=out, prompt_tokens=150, trace_prompt_tokens=100,
                         error=error)


# Two workflows of two stages and one that failed:
#   w1 arrives at 0: a [0, 0.5 first, 2.5 end, 21 tokens], b [2.5, 3.0, 4.0, 11 tokens]
#   w2 arrives at 1: a [1, 2.0, 3.0, 11 tokens],          a [3.0, 3.5, 5.0, 1 token]
#   w3 arrives at 2: error on its first call (excluded, counted)
REQUESTS = [
    call("w1", 0, "a", 0.0, 0.5, 2.5, 21), call("w1", 1, "b", 2.5, 3.0, 4.0, 11),
    call("w2", 0, "a", 1.0, 2.0, 3.0, 11), call("w2", 1, "a", 3.0, 3.5, 5.0, 1),
    call("w3", 0, "", 2.0, None, 2.1, 0, error="HTTP 503"),
]
WORKFLOWS = [
    WorkflowRecord("w1", "p1", "wf", 2, arrival_s=0.0, end_s=4.0, attempts=1, correct=True,
                   score=1.0, output_tokens=32, ttca_s=4.0, final_models=["b"]),
    WorkflowRecord("w2", "p2", "wf", 2, arrival_s=1.0, end_s=5.0, attempts=1, correct=False,
                   score=0.0, output_tokens=12, final_models=["a"]),
    WorkflowRecord("w3", "p3", "wf", 2, arrival_s=2.0, end_s=2.1, error="stage 0: HTTP 503"),
]
ENGINES = em.EngineCounters(prefix_queries=1000, prefix_hits=250, queue_sum_s=3.0,
                            queue_count=4, preemptions=2)


def test_request_formulas() -> None:
    assert ttft(REQUESTS[0]) == 0.5
    assert tpot(REQUESTS[0]) == pytest.approx(2.0 / 20)
    assert tpot(REQUESTS[3]) is None and ttft(REQUESTS[4]) is None


def test_summary_of_a_hand_made_schedule() -> None:
    s = summarize(REQUESTS, WORKFLOWS, ENGINES)
    assert (s["workflows"], s["errors"], s["calls"]) == (3, 1, 4)
    assert s["e2e_s"]["mean"] == pytest.approx(4.0) and s["e2e_s"]["p50"] == pytest.approx(4.0)
    assert s["e2e_per_token_s"]["mean"] == pytest.approx((4 / 32 + 4 / 12) / 2)
    assert s["makespan_s"] == pytest.approx(5.0)
    assert s["throughput_tok_s"] == pytest.approx(44 / 5.0)
    assert s["ttft_s"]["mean"] == pytest.approx((0.5 + 0.5 + 1.0 + 0.5) / 4)
    assert s["tpot_s"]["mean"] == pytest.approx((2.0 / 20 + 1.0 / 10 + 1.0 / 10) / 3)
    assert s["score"] == 0.5 and s["accuracy"] == 0.5 and s["solved"] == 0.5
    assert s["ttca_s"]["mean"] == 4.0 and s["ttca_s"]["n"] == 1
    assert s["traffic"] == {"a": {"calls": 0.75, "tokens": pytest.approx(33 / 44)},
                            "b": {"calls": 0.25, "tokens": pytest.approx(11 / 44)}}
    assert s["queue_s"] == {"mean": 0.75, "n": 4}
    assert s["kv_hit_rate"] == 0.25 and s["preemptions"] == 2
    assert s["prompt_token_ratio"] == 1.5


def test_distribution() -> None:
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert d["mean"] == 2.5 and d["p50"] == 2.5 and d["p99"] == pytest.approx(3.97)
    assert distribution([]) == {"mean": None, "p50": None, "p95": None, "p99": None, "n": 0}


METRICS_TEXT = """\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 500.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 5.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 2.5
"""


def test_engine_counters_parse_and_difference() -> None:
    after = em.parse_counters(METRICS_TEXT)
    assert (after.prefix_queries, after.prefix_hits, after.preemptions) == (500, 128, 3)
    assert (after.queue_sum_s, after.queue_count) == (2.5, 5)
    before = em.EngineCounters(prefix_queries=100, prefix_hits=0, queue_sum_s=0.5,
                               queue_count=1)
    d = em.total([after - before, after - before])
    assert em.hit_rate(d) == pytest.approx(256 / 800)
    assert em.mean_queue_s(d) == pytest.approx(4.0 / 8)
    assert em.hit_rate(em.EngineCounters()) is None


def summary_of(runs: list[tuple[str, float, float, float]]) -> dict[str, Any]:
    """(policy, rate, mean E2E, score) -> a summary with those values."""
    out: dict[str, Any] = {"meta": {"baseline": "vllm:fcfs", "rates": [1.0], "seed": 0,
                                    "policies": [{"label": p} for p, *_ in runs]},
                           "runs": []}
    for policy, rate, e2e, score in runs:
        s = summarize(REQUESTS, WORKFLOWS, ENGINES)
        s["e2e_s"]["mean"], s["score"] = e2e, score
        s["queue_s"]["mean"] = e2e / 4
        out["runs"].append({"policy": policy, "rate": rate, "repeat": 0, "summary": s})
    return out


def test_tables_show_ratios_against_the_baseline() -> None:
    summary = summary_of([("chimera:stjf", 1.0, 3.0, 0.6), ("vllm:fcfs", 1.0, 4.0, 0.5)])
    text = markdown_tables(summary)
    assert "| chimera:stjf | 1 | 3 |" in text and "| vllm:fcfs | 1 | 4 |" in text
    assert "| chimera:stjf | 1 | 0.75x |" in text and "| vllm:fcfs | 1 | 1.00x |" in text
    row = flat_rows(summary)[0]
    assert row["e2e_s.mean/baseline"] == 0.75 and row["score/baseline"] == pytest.approx(1.2)


def test_tables_open_with_the_replays_warnings() -> None:
    summary = summary_of([("chimera:stjf", 1.0, 3.0, 0.6), ("vllm:fcfs", 1.0, 4.0, 0.5)])
    summary["meta"]["warnings"] = ["warning: drift"]
    assert markdown_tables(summary).startswith("**warning: drift**\n")


def test_block_size_of_cache_config_labels() -> None:
    assert em.block_size({"block_size": "128", "num_gpu_blocks": "512"}) == 128
    assert [em.block_size(x) for x in ({}, {"block_size": "None"}, {"block_size": "-16"},
                                       {"block_size": "0"})] == [None] * 4


def test_tables_without_the_baseline_say_so() -> None:
    text = markdown_tables(summary_of([("chimera:stjf", 1.0, 3.0, 0.6)]))
    assert "no ratios: the baseline 'vllm:fcfs' was not run" in text


def test_output_files(tmp_path: Path) -> None:
    summary = summary_of([("chimera:stjf", 1.0, 3.0, 0.6), ("vllm:fcfs", 1.0, 4.0, 0.5)])
    for r in summary["runs"]:
        write_run(tmp_path, {**r, "requests": REQUESTS, "workflows": WORKFLOWS})
    write_summary(tmp_path, summary)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 10 and json.loads(lines[0])["policy"] == "chimera:stjf"
    csv_lines = (tmp_path / "workflows.csv").read_text().splitlines()
    assert csv_lines[0].startswith("policy,rate,repeat,fold,job_id") and len(csv_lines) == 7
    stored = json.loads((tmp_path / "summary.json").read_text())
    assert [c["policy"] for c in stored["intervals"]["comparisons"]] == ["chimera:stjf"]
    for name in ("summary.json", "summary.csv", "summary.md", "frontier.png", "cdf.png",
                 "traffic.png"):
        assert (tmp_path / name).stat().st_size > 0
