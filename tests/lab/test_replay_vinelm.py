"""The pure parts of the live VineLM replay: renaming, calibrated latencies, the static
baseline's choice, and the summary."""

from __future__ import annotations

import pytest

from kernels_bench.lab.vinelm.executions import RecordedExecutor
from kernels_bench.lab.vinelm.replay import (Latency, Served, WorkflowResult, best_static,
                                             served_template, summarize)
from router.vinelm.estimate import build_trie
from router.vinelm.objective import Objective
from router.vinelm.trie import prefixes
from tests.lab.test_vinelm_executions import INVS, PRICES, TEMPLATE, full_table

TO_RECORDED = {"fast": "m1", "slow": "m2"}


def test_served_names_and_calibrated_latency() -> None:
    t = served_template(TEMPLATE, {"m1": "fast", "m2": "slow"})
    assert t.signature() == [[s, ["fast", "slow"]] for s, _ in TEMPLATE.signature()]
    table = full_table(["a"])
    served = Served(RecordedExecutor(table, PRICES), TO_RECORDED,
                    {"fast": Latency(0.1, 0.01), "slow": Latency(0.5, 0.05)})
    e = table["a", ("m2",)]
    out = served.run("a", ("slow",))
    assert out.latency_s == pytest.approx(0.5 + 0.05 * e.stage.output_tokens)
    assert out.cost == pytest.approx(PRICES.cost("m2", e.stage.prompt_tokens,
                                                 e.stage.output_tokens))


def test_best_static_is_the_most_accurate_that_fits_else_the_fastest() -> None:
    # m2 is more accurate per answering call and twice as slow
    mu, cost, lat = {}, {}, {}
    for p in prefixes(INVS):
        answers = INVS[len(p) - 1].answers
        c = (0.6 if p[-1] == "m2" else 0.3) if answers else 0.0
        parent = mu.get(p[:-1], 0.0)
        mu[p] = parent + (1 - parent) * c
        cost[p], lat[p] = (2.0, 2.0) if p[-1] == "m2" else (1.0, 1.0)
    trie = build_trie("math", INVS, mu, cost, lat, {})
    # static paths (planner, solver, verifier, solver): solver and verifier reused
    assert best_static(TEMPLATE, trie, Objective("max_accuracy", max_latency_s=100)) == \
        ("m1", "m2", "m1", "m2")
    # the m2 solver needs 6 s: within 5 s only m1 solves, and the cheapest such path wins
    assert best_static(TEMPLATE, trie, Objective("max_accuracy", max_latency_s=5.0)) == \
        ("m1", "m1", "m1", "m1")
    # a cost budget binds the same way
    assert best_static(TEMPLATE, trie, Objective("max_accuracy", max_cost=5.0)) == \
        ("m1", "m1", "m1", "m1")
    # nothing fits 1 s: the fastest path
    assert best_static(TEMPLATE, trie, Objective("max_accuracy", max_latency_s=1.0)) == \
        ("m1", "m1", "m1", "m1")


def test_summary_counts_violations_and_leaves_errors_out() -> None:
    rs = [WorkflowResult("vinelm", 10.0, f"w{i}", "p", 0.0, end_s=t, success=ok,
                         cost=1.0, models=["fast"] * n)
          for i, (t, ok, n) in enumerate([(5.0, True, 2), (12.0, False, 4), (8.0, True, 1)])]
    rs.append(WorkflowResult("vinelm", 10.0, "w9", "p", 0.0, end_s=1.0, error="HTTP 503"))
    s = summarize(rs)
    assert s["workflows"] == 4 and s["errors"] == 1
    assert s["accuracy"] == pytest.approx(2 / 3)
    assert s["slo_violations"] == pytest.approx(1 / 3)
    assert s["calls_per_model"] == {"fast": 7} and s["p95_latency_s"] == 12.0
