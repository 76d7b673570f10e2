"""The replay on a trace with sampled runs: each job replays one recorded sample per model
(seeded, the same for every policy), and the expected score (the final model's mean over
its samples) is recorded, summarised and given an interval; without samples, nothing
changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from kernels_bench.lab.replay import intervals as iv
from kernels_bench.lab.replay.client import AgenticClient, ClientSettings
from kernels_bench.lab.replay.metrics import summarize
from kernels_bench.lab.replay.report import interval_tables
from kernels_bench.lab.replay.workload import Job, draw_samples, expected_score
from kernels_bench.lib.engine_metrics import EngineCounters
from kernels_bench.lib.priors import forced_tokens
from tests.lab.test_replay_client import FakeRouter
from tests.lab.test_replay_intervals import records
from tests.replay_fixture import output_tokens, sample_correct, tiny_trace

MAP = {"a": "small", "b": "large"}
K = 3


def test_without_samples_a_job_replays_the_greedy_run_unchanged(tmp_path: Path) -> None:
    run = tiny_trace(tmp_path).runs[0]
    assert draw_samples(run, 0, "w0000") is run
    assert expected_score(run, "small") is None


def test_each_job_draws_one_recorded_sample_per_model_seeded(tmp_path: Path) -> None:
    run = next(r for r in tiny_trace(tmp_path, samples=K).runs if r.workflow == "plan_solve")
    drawn = [draw_samples(run, 0, f"w{i:04d}") for i in range(40)]
    assert [d.models["small"].sample for d in drawn] == \
        [draw_samples(run, 0, f"w{i:04d}").models["small"].sample for i in range(40)]
    assert {d.models["small"].sample for d in drawn} == set(range(K))  # every sample drawn
    assert [d.models["small"].sample for d in drawn] != [d.models["large"].sample
                                                         for d in drawn]  # per model
    assert [d.models["small"].sample for d in drawn] != \
        [draw_samples(run, 1, f"w{i:04d}").models["small"].sample for i in range(40)]
    d = drawn[0]
    k = d.models["small"].sample
    assert forced_tokens(d, "small", 1) == output_tokens("small", 0, 1, k)
    assert d.samples == run.samples  # kept for the expected score


def test_the_client_scores_the_drawn_sample_and_records_the_expected_score(
        tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path, samples=K)
    run = next(r for r in trace.runs if r.problem_id == "p1" and r.workflow == "plan_solve")
    job = Job("w0007", draw_samples(run, 0, "w0007"), 0.0)
    router = FakeRouter(lambda b: "a")
    client = AgenticClient(ClientSettings(MAP), router.send, router.clock)
    asyncio.run(client.workflow(job))
    (wf,) = client.workflows
    k = job.run.models["small"].sample
    assert [r.forced_tokens for r in client.requests] == [output_tokens("small", 1, s, k)
                                                          for s in (0, 1)]
    assert wf.correct == sample_correct("small", 1, k)
    assert wf.expected_score == pytest.approx(np.mean([sample_correct("small", 1, j)
                                                       for j in range(K)]))


def test_expected_score_is_summarised_and_gets_an_interval_only_when_present() -> None:
    rng = np.random.default_rng(0)
    e2e = rng.exponential(5.0, (2, 30))
    score = rng.integers(0, 2, (2, 30)).astype(float)
    plain = records("a", e2e, score) + records("base", e2e, score)
    out = iv.summarize(plain, baseline="base")
    assert all("expected_score" not in row for row in out["values"] + out["comparisons"])
    assert "expected score" not in interval_tables({"intervals": out})
    expected = rng.random((2, 30))
    rows = [{**r, "expected_score": float(expected[r["repeat"], int(r["job_id"][1:])]
                                          + (0.1 if r["policy"] == "a" else 0.0))}
            for r in plain]
    out = iv.summarize(rows, baseline="base")
    (c,) = out["comparisons"]
    assert c["expected_score"]["value"] == pytest.approx(10.0)
    assert c["expected_score"]["verdict"] == "finding"  # paired: the same draws, +10 points
    assert c["score"]["value"] == 0.0
    by = {row["policy"]: row for row in out["values"]}
    assert by["base"]["expected_score"]["value"] == pytest.approx(100 * expected.mean())
    assert "expected score (points)" in interval_tables({"intervals": out})


def test_run_metrics_have_the_expected_score_only_with_samples(tmp_path: Path) -> None:
    for samples, has in ((0, False), (K, True)):
        run = tiny_trace(tmp_path / str(samples), samples=samples).runs[0]
        job = Job("w0000", draw_samples(run, 0, "w0000"), 0.0)
        router = FakeRouter(lambda b: "b")
        client = AgenticClient(ClientSettings(MAP), router.send, router.clock)
        asyncio.run(client.workflow(job))
        s = summarize(client.requests, client.workflows, EngineCounters())
        assert ("expected_score" in s) is has
        if has:
            assert s["expected_score"] == pytest.approx(2 / 3)  # large: k % 3 != 2


def test_make_jobs_replays_one_sample_per_model_the_same_at_every_rate(tmp_path: Path
                                                                       ) -> None:
    from kernels_bench.lab.replay.run import ReplayOptions, make_jobs

    opts = ReplayOptions(
        policies=[], rates=[1.0, 2.0], arrival="poisson", cv=1.0, workflows=12, seed=0,
        model_map=MAP, max_attempts=1, run_attempts=1, priors_from_trace=False,
        baseline="vllm:fcfs", repeats=1, problems="all", artifacts=[], out=tmp_path / "out",
        run_dir=tmp_path / "run")
    for samples in (0, K):
        jobs = make_jobs(tiny_trace(tmp_path / str(samples), samples=samples),
                         ["small", "large"], opts)
        drawn = [[(j.job_id, j.run.models["small"].sample, j.run.models["large"].sample)
                  for j in jobs[rate]] for rate in opts.rates]
        assert drawn[0] == drawn[1]
        assert all((s is None) == (samples == 0) and (g is None) == (samples == 0)
                   for _, s, g in drawn[0])
