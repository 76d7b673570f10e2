"""Replay workload: run selection, length forcing, context splicing, arrivals, priors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from kernels_bench.lab.replay.arrivals import arrival_times, gamma_shape_scale
from kernels_bench.lab.replay.client import ClientSettings, stage_body
from kernels_bench.lab.replay.run import prior_runs
from kernels_bench.lab.replay.workload import (Job, WorkloadError, merge_traces, outcome,
                                               remaining_tokens, select_runs, stage_messages)
from kernels_bench.lib.priors import fill_static_priors, forced_tokens, trace_priors
from router.predictors.records import Split, held_out
from router.trace_format import Trace, WorkflowRun
from tests.replay_fixture import output_text, output_tokens, tiny_trace

MAP = {"a": "small", "b": "large"}


@pytest.fixture
def trace(tmp_path: Path) -> Trace:
    return tiny_trace(tmp_path)


def plan_solve(trace: Trace, problem: int) -> WorkflowRun:
    return next(r for r in trace.runs
                if r.problem_id == f"p{problem}" and r.workflow == "plan_solve")


def test_select_runs_is_seeded_and_cycles(trace: Trace) -> None:
    a = select_runs(trace, ["small", "large"], 20, seed=1)
    assert a == select_runs(trace, ["small", "large"], 20, seed=1)
    assert a != select_runs(trace, ["small", "large"], 20, seed=2)
    assert a[:8] == a[8:16] and len({(r.problem_id, r.workflow) for r in a}) == 8


def test_select_runs_needs_complete_runs(trace: Trace) -> None:
    with pytest.raises(WorkloadError, match="ghost: 0 runs"):
        select_runs(trace, ["small", "ghost"], 3, seed=0)


def test_forced_and_remaining_tokens(trace: Trace) -> None:
    run = plan_solve(trace, 3)
    assert forced_tokens(run, "small", 0) == output_tokens("small", 3, 0) == 16
    assert forced_tokens(run, "large", 1) == 37
    assert remaining_tokens(run, "large", 0) == 36 + 37
    assert remaining_tokens(run, "small", 1) == 17


def test_stage_messages_splice_the_served_history(trace: Trace) -> None:
    run = plan_solve(trace, 1)
    first = stage_messages(run, 0, [])
    assert first == [{"role": m.role, "content": m.content}
                     for m in run.models["large"].stages[0].messages]
    same = stage_messages(run, 1, ["small"])
    assert same[1]["content"] == run.models["small"].stages[1].messages[1].content
    mixed = stage_messages(run, 1, ["large"])
    assert output_text("large", 1, 0).strip() in mixed[1]["content"]
    assert "small says" not in mixed[1]["content"]
    with pytest.raises(ValueError, match="earlier stages"):
        stage_messages(run, 1, [])


def test_outcome_is_the_final_stage_models(trace: Trace) -> None:
    run = plan_solve(trace, 1)
    assert outcome(run, "small") == (False, 0.0)
    assert outcome(run, "large") == (True, 1.0)


def test_stage_body_forces_each_models_length(trace: Trace) -> None:
    job = Job("w0001", plan_solve(trace, 2), 0.0)
    body = stage_body(job, attempt=2, stage=1, served=["large"], tried=["a"],
                      s=ClientSettings(MAP))
    assert body["per_model"] == {"max_tokens": {"a": 15, "b": 35}}
    assert body["max_tokens"] == 35 and body["ignore_eos"] is True and body["stream"] is True
    assert body["model"] == "auto"
    assert body["workflow"] == {
        "program_id": "w0001.2", "workflow": "plan_solve", "stage": "solver",
        "stage_index": 1, "num_stages": 2, "final": True, "attempt": 2,
        "tried_models": ["a"], "checked": False}
    assert "priority" not in body


def test_stage_body_oracle_priority_is_true_remaining_tokens(trace: Trace) -> None:
    job = Job("w0", plan_solve(trace, 0), 0.0)
    body = stage_body(job, 1, 0, [], [], ClientSettings(MAP, oracle=True))
    assert body["per_model"]["priority"] == {"a": 10 + 11, "b": 30 + 31}


def test_poisson_and_gamma_arrivals() -> None:
    t = arrival_times(20000, 4.0, "poisson", 2.0, seed=3)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.25) < 0.01 and abs(gaps.std() / gaps.mean() - 1) < 0.05
    g = np.diff(arrival_times(20000, 4.0, "gamma", 2.0, seed=3))
    assert abs(g.mean() - 0.25) < 0.02 and abs(g.std() / g.mean() - 2) < 0.15
    assert arrival_times(5, 1.0, "gamma", 2.0, 7) == arrival_times(5, 1.0, "gamma", 2.0, 7)
    assert gamma_shape_scale(2.0, 0.5) == (4.0, 0.125)


@pytest.mark.parametrize("args, fragment", [
    ((3, 1.0, "uniform", 1.0, 0), "arrival process"),
    ((3, 0.0, "poisson", 1.0, 0), "rate must be > 0"),
    ((3, 1.0, "gamma", 0.0, 0), "--cv must be > 0"),
])
def test_arrival_errors(args: tuple, fragment: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=fragment):
        arrival_times(*args)


def test_trace_priors_fill_only_missing_static_tables(trace: Trace) -> None:
    priors = trace_priors(trace.complete_runs(MAP.values()), MAP)
    assert priors["accuracy"] == {"a": 0.5, "b": 1.0}
    # stages: per problem p, plan_solve (2 stages) + solve (1 stage)
    small = [10 + 2 * p + s for p in range(4) for s in (0, 1)] + [10 + 2 * p for p in range(4)]
    assert priors["mean_output_tokens"]["a"] == pytest.approx(np.mean(small))
    tables: dict[str, dict[str, Any]] = {
        "chimera": {"static_prior": True, "confidence": {"a": 0.1, "b": 0.2}},
        "laar": {"static_prior": False}, "lmetric": {}}
    filled = fill_static_priors(tables, priors)
    assert filled["chimera"]["confidence"] == {"a": 0.1, "b": 0.2}
    assert filled["chimera"]["mean_output_tokens"] == priors["mean_output_tokens"]
    assert filled["laar"] == {"static_prior": False} and filled["lmetric"] == {}
    assert "mean_output_tokens" not in tables["chimera"]  # the input is not changed



def test_only_held_out_problems_are_replayed(trace: Trace) -> None:
    models = ["small", "large"]
    every = {r.problem_id for r in trace.complete_runs(models)}
    kept = {r.problem_id for r in select_runs(trace, models, 50, 0, [Split(1, 0.5)])}
    assert kept == {p for p in every if held_out(p, 1, 0.5)}
    assert kept and kept < every
    both = {r.problem_id for r in select_runs(trace, models, 50, 0, [Split(1, 0.5), Split(2, 0.5)])}
    assert both == {p for p in kept if held_out(p, 2, 0.5)}
    with pytest.raises(WorkloadError, match="other --problems"):
        select_runs(trace, models, 5, 0, [Split(1, 0.0)])
    trained = {r.problem_id for r in select_runs(trace, models, 50, 0, [Split(1, 0.5)], "trained")}
    assert trained == every - kept
    assert len(select_runs(trace, models, 50, 0, [Split(1, 0.5)], "all")) == 50
    with pytest.raises(WorkloadError, match="expected one of"):
        select_runs(trace, models, 5, 0, [], "some")


def test_folds_partition_the_problems(trace: Trace) -> None:
    """Cross-fitting: fold k of K holds out its own problems; together, every problem once."""
    models = ["small", "large"]
    every = {r.problem_id for r in trace.complete_runs(models)}
    folds = [Split.fold(1, k, 3) for k in range(3)]
    held = [{p for p in every if f.holds_out(p)} for f in folds]
    assert sum(map(len, held)) == len(every) and set().union(*held) == every
    assert held[0] == {p for p in every if held_out(p, 1, 1 / 3)}  # fold 0: a plain split
    for f, mine in zip(folds, held):
        if mine:
            assert {r.problem_id for r in select_runs(trace, models, 50, 0, [f])} == mine
    assert Split.of(folds[2].info()) == folds[2]
    assert Split.of({"seed": 1, "holdout": 0.2}) == Split(1, 0.2, 0.0)  # older artifacts


def test_static_priors_average_only_trained_problems(trace: Trace) -> None:
    models = ["small", "large"]
    split = [Split(1, 0.5)]
    runs = prior_runs(trace, models, split)
    assert runs and not any(held_out(r.problem_id, 1, 0.5) for r in runs)
    assert prior_runs(trace, models, []) == trace.complete_runs(models)


def test_traces_merge_into_one_workload(trace: Trace) -> None:
    renamed = [msgspec.structs.replace(r, problem_id="code-" + r.problem_id) for r in trace.runs]
    other = Trace(msgspec.structs.replace(trace.header, suite="code"), renamed)
    mixed = merge_traces([trace, other])
    assert mixed.header.suite == f"{trace.header.suite}+code"
    assert len(mixed.runs) == 2 * len(trace.runs) and mixed.models == trace.models
    assert merge_traces([trace]) is trace
    with pytest.raises(WorkloadError, match="is in two traces"):
        merge_traces([trace, trace])
    bad = Trace(msgspec.structs.replace(other.header, workflows={"solve": ["x", "y"]}), renamed)
    with pytest.raises(WorkloadError, match="suite 'code': workflow 'solve' has roles"):
        merge_traces([trace, bad])


def test_retry_on_examples_gives_each_job_its_models_verdicts(tmp_path: Path) -> None:
    """``--retry-on examples``: every job carries, per trace model, whether the final
    program of its run passes its prompt's examples (the shipped code trace, real
    outputs); math jobs get None; other retry rules compute nothing."""
    from kernels_bench.lab.replay.run import ReplayOptions, make_jobs
    from kernels_bench.lab.trace.suites import code_problem, examples_verdicts, passes_examples
    from router.trace_format import load_trace

    root = Path(__file__).resolve().parents[2]
    models = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
    code = load_trace(str(root / "data/traces/code.jsonl.gz"))

    def opts(retry_on: str, attempts: int) -> ReplayOptions:
        return ReplayOptions(
            policies=[], rates=[1.0], arrival="poisson", cv=1.0, workflows=4, seed=0,
            model_map={"tiny-a": models[0], "tiny-b": models[1]}, max_attempts=attempts,
            run_attempts=1, priors_from_trace=False, baseline="vllm:fcfs", repeats=1,
            problems="all", artifacts=[], out=tmp_path / "out", run_dir=tmp_path / "run",
            retry_on=retry_on, examples_check=examples_verdicts)

    jobs = make_jobs(code, models, opts("examples", 2))[1.0]
    for j in jobs:
        problem = code_problem(j.run.problem_id)
        assert problem is not None
        assert j.examples == {m: passes_examples(problem, j.run.models[m].stages[-1].output_text)
                              for m in models}
    assert {v for j in jobs for v in j.examples.values()} >= {True, False}
    assert all(not j.examples for j in make_jobs(code, models, opts("wrong", 2))[1.0])
    assert all(not j.examples for j in make_jobs(code, models, opts("examples", 1))[1.0])
    math_run = load_trace(str(root / "data/traces/math.jsonl.gz")).runs[0]
    assert examples_verdicts(math_run, models) == {m: None for m in models}


def test_the_replay_command_passes_the_retry_rule_and_its_check(tmp_path: Path) -> None:
    from kernels_bench.lab.commands.replay import build_parser, replay_options
    from kernels_bench.lab.trace.suites import examples_verdicts

    def opts(*extra: str) -> Any:
        return replay_options(build_parser(live=False).parse_args(
            ["--cluster", "c.toml", "--trace", "t", *extra]), tmp_path)

    o = opts("--retries", "1", "--retry-on", "examples")
    assert (o.max_attempts, o.retry_on, o.examples_check) == (2, "examples", examples_verdicts)
    assert opts().retry_on == "wrong"
    with pytest.raises(SystemExit):
        opts("--retry-on", "tests")
