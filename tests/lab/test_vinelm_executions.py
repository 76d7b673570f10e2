"""Recorded real executions: the file format, what the collector still has to run, the
recorded executor, and the cross-fitted experiment over it."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest

from kernels_bench.lab.vinelm.collect import pending
from kernels_bench.lab.vinelm.executions import (FORMAT, VERSION, ExecHeader, Execution,
                                                 RecordedExecutor, read_executions)
from kernels_bench.lab.vinelm.executors import Prices
from kernels_bench.lab.vinelm.experiment import recorded_experiment
from router.trace_format import Message, Stage, TraceFormatError, TraceWriter
from router.vinelm.estimate import EstimationSettings
from router.vinelm.profiling import MissingExecution, exhaustive
from router.vinelm.synthetic import default_env
from router.vinelm.template import parse_template

MODELS = ("m1", "m2")
TEMPLATE = parse_template("math", {
    "stages": [{"name": "planner", "models": list(MODELS)},
               {"name": "solver", "models": list(MODELS), "answers": True},
               {"name": "verifier", "models": list(MODELS)}],
    "loop": {"from": "verifier", "to": "solver", "max_iterations": 1}})
INVS = TEMPLATE.invocations()
PRICES = Prices({"m1": 1.0, "m2": 3.0}, {"m1": 2.0, "m2": 6.0})


def stage(role: str, index: int, out_tokens: int = 10, latency: float = 1.0) -> Stage:
    return Stage(index=index, role=role, messages=[Message("user", "q")], prompt_tokens=100,
                 output_tokens=out_tokens, output_text=f"{role} says", finish_reason="stop",
                 latency_s=latency)


def execution(problem: str, prefix: tuple[str, ...], success: bool = False) -> Execution:
    return Execution(problem, list(prefix), stage(INVS[len(prefix) - 1].stage, len(prefix) - 1),
                     success, None, "", "engine")


def header() -> ExecHeader:
    return ExecHeader(FORMAT, VERSION, "math", "math", TEMPLATE.signature(), {"seed": 0}, [])


def test_pending_skips_recorded_nodes_and_everything_below_a_success() -> None:
    table = {("p", (m,)): execution("p", (m,)) for m in MODELS}
    assert pending(table, ["p", "q"], INVS, 1) == {"m1": [("q", ("m1",))],
                                                    "m2": [("q", ("m2",))]}
    table[("p", ("m1", "m1"))] = execution("p", ("m1", "m1"), success=True)
    todo = pending(table, ["p"], INVS, 2)
    assert todo == {"m2": [("p", ("m1", "m2")), ("p", ("m2", "m2"))],
                    "m1": [("p", ("m2", "m1"))]}
    for m1, m2 in itertools.product(MODELS, MODELS):
        table.setdefault(("p", (m1, m2)), execution("p", (m1, m2)))
    todo3 = pending(table, ["p"], INVS, 3)
    # (m1, m1) succeeded: none of its 2 children runs; the other 3 parents have 2 each
    assert sum(len(v) for v in todo3.values()) == 6
    assert all(px[:2] != ("m1", "m1") for v in todo3.values() for _, px in v)
    for _, px in todo3["m2"]:
        table[("p", px)] = execution("p", px, success=True)
    # below the depth-3 successes nothing runs at depth 4 (the verifier never answers)
    assert all(px[:3][-1] == "m1" for v in pending(table, ["p"], INVS, 4).values()
               for _, px in v)


def full_table(problems: list[str]) -> dict:
    """Every node not below a success, outcomes from the synthetic environment."""
    env = default_env(INVS, seed=3)
    table = {}
    for p in problems:
        frontier: list[tuple[str, ...]] = [()]
        while frontier:
            parent = frontier.pop()
            if len(parent) == len(INVS) or (parent and env.succeeds(p, parent)):
                continue
            for m in INVS[len(parent)].models:
                child = parent + (m,)
                out = env.run(p, child)
                table[(p, child)] = Execution(p, list(child), stage(
                    INVS[len(child) - 1].stage, len(child) - 1,
                    out_tokens=int(out.cost * 10), latency=out.latency_s), out.success, None, "",
                    "engine")
                frontier.append(child)
    return table


def test_recorded_executor_absorbs_success_and_refuses_unrun_nodes() -> None:
    table = full_table(["a", "b", "c"])
    ex = RecordedExecutor(table, PRICES)
    assert all(ex.complete(p, INVS) for p in "abc")
    succeeded = next(k for k, e in table.items() if e.success and len(k[1]) < len(INVS))
    problem, node = succeeded
    child = node + ("m1",)
    with pytest.raises(MissingExecution):
        ex.run(problem, child)
    e = table[succeeded]
    assert ex.run(problem, node).cost == pytest.approx(
        PRICES.cost(node[-1], e.stage.prompt_tokens, e.stage.output_tokens))
    gt = exhaustive(ex, INVS, ["a", "b", "c"], stop_at_success=True)
    assert gt.accuracy[child] >= gt.accuracy[node] > 0
    assert gt.executions == len(table)
    del table[succeeded]
    assert not ex.complete(problem, INVS)


def test_recorded_experiment_reports_folds_over_all_problems() -> None:
    problems = [f"x{i}" for i in range(30)]
    ex = RecordedExecutor(full_table(problems), PRICES)
    rep = recorded_experiment(TEMPLATE, ex, problems, 1, EstimationSettings(1, 1, 5.0), 0,
                              folds=3, slow_factor=4.0, slow_share=0.3)
    prof = rep["profiling"]["profiling"]
    assert 0 < prof["sparse_executions"] < prof["exhaustive_executions"]
    rows = rep["frontier"]["rows"]
    assert len(rows) == 8 and all(len(r["static_assignments"]) == 3 for r in rows)
    assert all(0 <= r["vinelm_accuracy"] <= 1 for r in rows)
    lat = rep["latency_frontier"]["rows"]
    assert [r["budget"] for r in lat] == sorted(r["budget"] for r in lat) and len(lat) == 8
    # a latency budget binds the static choice: the fastest static path at the tightest
    assert all(r["static_latency_s"] <= lat[-1]["budget"] + 1e-9 for r in lat[1:])
    assert rep["slo"]["slow_model"] == "m2" and len(rep["slo"]["rows"]) == 3


def test_executions_file_round_trip_and_clear_errors(tmp_path: Path) -> None:
    out = tmp_path / "ex.jsonl.gz"
    with TraceWriter(out) as w:
        w.append(header())
        w.append(execution("p", ("m1",)))
        w.append(execution("p", ("m1", "m2"), success=True))
    h, table = read_executions(out)
    assert h.workflow == "math" and table[("p", ("m1", "m2"))].success
    with TraceWriter(out) as w:
        w.append(execution("p", ("m1",)))
    with pytest.raises(TraceFormatError, match="line 4: duplicate execution"):
        read_executions(out)
    bad = tmp_path / "bad.jsonl.gz"
    with TraceWriter(bad) as w:
        w.append(header())
        w.append(Execution("p", ["m1", "m3"], stage("solver", 1), False, None, "", "engine"))
    with pytest.raises(TraceFormatError, match="depth 2 runs solver with one of"):
        read_executions(bad)
    deep = tmp_path / "deep.jsonl"
    with TraceWriter(deep) as w:
        w.append(header())
        w.append(Execution("p", ["m1"] * 5, stage("solver", 4), False, None, "", "engine"))
    with pytest.raises(TraceFormatError, match="not a node of the 4-deep trie"):
        read_executions(deep)
    empty = tmp_path / "empty.jsonl.gz"
    empty.write_bytes(gzip.compress(b""))
    with pytest.raises(TraceFormatError, match="no header"):
        read_executions(empty)
