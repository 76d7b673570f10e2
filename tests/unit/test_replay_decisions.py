"""The replay's decision figures from the router's latency histogram: quantiles as
Prometheus's ``histogram_quantile`` computes them, the exact share within a bound, and a
run's difference of two scrapes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from kernels_bench.lib.engine_metrics import Decisions
from router.state.stats import LATENCY_BUCKETS_S, Histogram


def test_quantile_interpolates_within_the_bucket() -> None:
    # 10 decisions: 4 in (0, 0.5 ms], 4 in (0.5, 1 ms], 2 in (1, 2.5 ms]
    d = Decisions(0.01, 10, ((5e-4, 4), (1e-3, 8), (2.5e-3, 10), (math.inf, 10)))
    assert d.quantile(0.5) == pytest.approx(5e-4 + 5e-4 * 1 / 4)
    assert d.quantile(0.2) == pytest.approx(2.5e-4)
    assert d.quantile(0.9) == pytest.approx(1e-3 + 1.5e-3 * 1 / 2)
    assert d.at_most(1e-3) == 0.8 and d.at_most(5e-3) == 1.0 and d.at_most(1e-4) == 0.0
    assert d.mean_s == pytest.approx(1e-3)


def test_the_unbounded_bucket_gives_the_largest_bound() -> None:
    d = Decisions(10.0, 4, ((1e-3, 1), (1.0, 2), (math.inf, 4)))
    assert d.quantile(0.99) == 1.0 and d.quantile(0.25) == pytest.approx(1e-3)


def test_a_run_is_the_difference_of_two_scrapes() -> None:
    before = Decisions(1.0, 5, ((1e-3, 5), (math.inf, 5)))
    after = Decisions(1.5, 8, ((1e-3, 6), (math.inf, 8)))
    run = after - before
    assert (run.count, run.sum_s, run.cumulative) == (3, 0.5, ((1e-3, 1), (math.inf, 3)))
    assert run.at_most(1e-3) == pytest.approx(1 / 3)


def test_no_decisions_gives_no_figures() -> None:
    assert Decisions().summary() == {"decision_s_mean": None, "decision_s_p50": None,
                                     "decision_s_p99": None, "decisions_within_1ms": None}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-6, 2.0), min_size=1, max_size=300), st.floats(0.01, 0.99))
def test_of_matches_the_routers_histogram_and_brackets_the_true_quantile(
        values: list[float], q: float) -> None:
    hist = Histogram()
    for v in values:
        hist.observe(v)
    d = Decisions.of(values)
    # the router counts a value equal to a bound in that bound's bucket, as Prometheus does
    assert [c for _, c in d.cumulative] == list(map(float, _cumsum(hist.counts)))
    est, ordered = d.quantile(q), sorted(values)
    true = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    bounds = (0.0, *LATENCY_BUCKETS_S, math.inf)
    i = next(k for k in range(1, len(bounds)) if true <= bounds[k])
    assert bounds[i - 1] <= est <= min(bounds[i], LATENCY_BUCKETS_S[-1]) + 1e-12


def _cumsum(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out
