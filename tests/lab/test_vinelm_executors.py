"""The trace table executor: single-model prefixes from recorded whole-workflow runs."""

from __future__ import annotations

import pytest

from kernels_bench.lab.vinelm.executors import Prices, trace_table
from router.trace_format import Header, Message, ModelRun, Stage, Trace, WorkflowRun
from router.vinelm.profiling import MissingExecution, exhaustive
from router.vinelm.template import parse_template

FLOWS = {"plan_solve_verify_solve": ["planner", "solver", "verifier", "solver"],
         "plan_solve": ["planner", "solver"], "solve": ["solver"]}
MODELS = ("m1", "m2")
TEMPLATE = parse_template("math", {
    "stages": [{"name": "planner", "models": list(MODELS)},
               {"name": "solver", "models": list(MODELS), "answers": True},
               {"name": "verifier", "models": list(MODELS)}],
    "loop": {"from": "verifier", "to": "solver", "max_iterations": 1}})
PRICES = Prices({"m1": 1.0, "m2": 2.0}, {"m1": 10.0, "m2": 20.0})


def model_run(model: str, roles: list[str], correct: bool) -> ModelRun:
    stages = [Stage(index=i, role=r, messages=[Message("user", "q")], prompt_tokens=100 * (i + 1),
                    output_tokens=10, output_text="x", finish_reason="stop", latency_s=0.5 + i)
              for i, r in enumerate(roles)]
    return ModelRun(model=model, stages=stages, final_answer="1", correct=correct,
                    score=float(correct), total_output_tokens=10 * len(roles),
                    latency_s=1.0, detail="")


def trace() -> Trace:
    # problem p0: m1 right after plan_solve only; m2 right after plan_solve_verify_solve
    outcome = {("p0", "plan_solve", "m1"): True, ("p0", "plan_solve_verify_solve", "m2"): True}
    runs = [WorkflowRun(problem_id=p, workflow=w, roles=roles, user_prompt="q", reference="1",
                        models={m: model_run(m, roles, outcome.get((p, w, m), False))
                                for m in MODELS})
            for p in ("p0", "p1") for w, roles in FLOWS.items()]
    runs.append(WorkflowRun(problem_id="p2", workflow="solve", roles=["solver"],
                            user_prompt="q", reference="1",
                            models={m: model_run(m, ["solver"], True) for m in MODELS}))
    header = Header(format="hetserve-trace", version=1, suite="math", workflows=FLOWS,
                    settings={}, sources=[])
    return Trace(header=header, runs=runs)


def test_single_model_prefixes_come_from_the_workflow_ending_there() -> None:
    ex, problems = trace_table(trace(), TEMPLATE.invocations(), PRICES)
    assert problems == ["p0", "p1"]     # p2 has no run that starts with the planner
    assert [ex.run("p0", ("m1",) * k).success for k in (1, 2, 3, 4)] == \
        [False, True, False, False]
    assert [ex.run("p0", ("m2",) * k).success for k in (1, 2, 3, 4)] == \
        [False, False, False, True]
    out = ex.run("p1", ("m2", "m2", "m2"))        # the verifier: stage 2 of the long run
    assert out.cost == pytest.approx((300 * 2.0 + 10 * 20.0) / 1000)
    assert out.latency_s == 2.5
    with pytest.raises(MissingExecution, match="single-model runs only"):
        ex.run("p0", ("m1", "m2"))


def test_exhaustive_ground_truth_needs_mixed_runs_the_trace_lacks() -> None:
    ex, problems = trace_table(trace(), TEMPLATE.invocations(), PRICES)
    with pytest.raises(MissingExecution):
        exhaustive(ex, TEMPLATE.invocations(), problems)


def test_template_models_missing_from_the_trace_are_named() -> None:
    other = parse_template("math", {"stages": [{"name": "solver", "models": ["m1", "m9"],
                                                "answers": True}]})
    with pytest.raises(ValueError, match="the trace has no runs of m9"):
        trace_table(trace(), other.invocations(), PRICES)
