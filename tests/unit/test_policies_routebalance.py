"""RouteBalance: score, LPT order, dead reckoning, budgets, weights, adaptive window."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import pytest

from router.policies.routebalance import (AdaptiveWindow, Weights, budget_max_tokens,
                                          lpt_order, predicted_cost, predicted_latency_ms,
                                          request_weights, score)
from router.predictors.base import PredictorSet, QualityLength
from router.types import RoutingRequest
from tests.unit.test_policies_base import World, req

PROMPT = list(range(100, 112))   # P = 12


def test_formulas() -> None:
    assert predicted_cost(price=0.5, prompt_tokens=12, output_tokens=8) == 10
    assert predicted_latency_ms(decode_tokens=100, batch_size=4, output_tokens=50,
                                tpot_ms=10) == 750     # (100 / 4 + 50) x 10
    assert predicted_latency_ms(0, 0, 50, 10) == 500   # idle: own decode only
    w = Weights(quality=0.5, cost=0.25, latency=0.25)
    assert score(0.8, cost=2, latency=300, max_cost=4, max_latency=600, w=w) == \
        pytest.approx(0.4 - 0.125 - 0.125)
    assert score(0.8, 0, 0, 0, 0, w) == pytest.approx(0.4)
    assert budget_max_tokens(budget=1.0, price=0.001, prompt_tokens=12) == 988
    assert budget_max_tokens(1.0, 0.0, 12) is None


def test_lpt_order_is_longest_first_and_stable() -> None:
    assert lpt_order([10, 30, 20, 30]) == [1, 3, 2, 0]


def test_request_weights_are_normalised_and_checked() -> None:
    default = Weights(1 / 3, 1 / 3, 1 / 3)
    assert request_weights({}, default) is default
    assert request_weights({"quality": 2, "cost": 1, "latency": 1}, default) == \
        Weights(0.5, 0.25, 0.25)
    with pytest.raises(ValueError, match="unknown workflow weight 'speed'"):
        request_weights({"speed": 1}, default)
    with pytest.raises(ValueError, match="positive sum"):
        request_weights({"quality": 0, "cost": 0, "latency": 0}, default)


@pytest.mark.parametrize("gap,expected", [(None, 0.0), (0.2, 0.0), (0.05, 0.05),
                                          (0.01, 0.07), (0.001, 0.007)])
def test_adaptive_window(gap: float | None, expected: float) -> None:
    w = AdaptiveWindow(max_batch=8, max_window_s=0.1)
    w.gap_s = gap
    assert w.window_s() == pytest.approx(expected)


def test_window_tracks_the_arrival_gap() -> None:
    w = AdaptiveWindow(max_batch=8, max_window_s=0.1)
    for t in (0.0, 0.01, 0.02, 0.03):
        w.arrival(t)
    assert w.gap_s == pytest.approx(0.01)


class Estimator:
    """Per-request output lengths (by request id) and fixed qualities."""

    models = frozenset({"a", "b"})

    def __init__(self, lengths: dict[str, float], quality: dict[str, float]) -> None:
        self.lengths, self.quality = lengths, quality

    async def estimate(self, reqs: Sequence[RoutingRequest]) -> Any:
        return [{m: QualityLength(self.quality[m], self.lengths[r.request_id])
                 for m in self.models} for r in reqs]


SETTINGS: dict[str, Any] = {"static_prior": True, "w_quality": 0.0, "w_cost": 0.0,
                            "w_latency": 1.0, "cost_per_token": {"a": 0.001, "b": 0.004},
                            "decode_ms_per_token": {"a": 10, "b": 10}}


def batch(w: World, p: Any, reqs: list[RoutingRequest], model: str | None = "a") -> list[Any]:
    preds = asyncio.run(p.predict(reqs))
    return p.decide_batch(reqs, [w.cands(model)] * len(reqs), w.view(), preds)


def test_dead_reckoning_spreads_a_batch() -> None:
    w = World({"e0": "a", "e1": "a"})
    p = w.build("routebalance", SETTINGS, PredictorSet(
        knn=Estimator({"r1": 50, "r2": 50}, {"a": 0.5, "b": 0.5})))
    d = batch(w, p, [req("r1", PROMPT), req("r2", PROMPT)])
    # r1 -> e0 (tie); then e0 is dead-reckoned to b = 1, D = 50: (50 + 50) x 10 > 50 x 10
    assert [x.instance for x in d] == ["e0", "e1"]
    assert d[1].info["latency_ms"] == 500


def test_lpt_assigns_the_long_request_first() -> None:
    w = World({"e0": "a", "e1": "a"})
    w.load("e1", batch=1, decode=100)
    p = w.build("routebalance", SETTINGS, PredictorSet(
        knn=Estimator({"short": 10, "long": 300}, {"a": 0.5, "b": 0.5})))
    short, long_ = batch(w, p, [req("short", PROMPT), req("long", PROMPT)])
    # LPT: long first takes idle e0 (300 x 10 < (100 + 300) x 10); then short: e0 is at
    # (300 / 1 + 10) x 10 = 3100, e1 at (100 / 1 + 10) x 10 = 1100 -> e1
    assert (long_.instance, long_.info["lpt_rank"]) == ("e0", 0)
    assert (short.instance, short.info["lpt_rank"], short.info["latency_ms"]) == ("e1", 1, 1100)


def test_quality_weight_picks_the_better_model() -> None:
    w = World({"a0": "a", "b0": "b"})
    est = Estimator({"r": 100}, {"a": 0.5, "b": 0.9})
    quality = w.build("routebalance", {**SETTINGS, "w_quality": 1.0, "w_latency": 0.0},
                      PredictorSet(knn=est))
    cheap = w.build("routebalance", {**SETTINGS, "w_cost": 1.0, "w_latency": 0.0},
                    PredictorSet(knn=est))
    assert batch(w, quality, [req("r", PROMPT)], None)[0].model == "b"
    assert batch(w, cheap, [req("r", PROMPT)], None)[0].model == "a"
    per_request = batch(w, cheap, [req("r", PROMPT, weights={"quality": 1.0, "cost": 0.0})],
                        None)
    assert per_request[0].model == "b"


def test_budget_admission_and_max_tokens_clamp() -> None:
    w = World({"a0": "a", "b0": "b"})
    p = w.build("routebalance", {**SETTINGS, "w_quality": 1.0, "w_latency": 0.0},
                PredictorSet(knn=Estimator({"r": 100}, {"a": 0.5, "b": 0.9})))
    # cost: a = 0.001 x 112 = 0.112, b = 0.004 x 112 = 0.448
    d = batch(w, p, [req("r", PROMPT, max_tokens=500, budget=0.3)], None)[0]
    assert (d.model, d.max_tokens) == ("a", 288)      # floor(0.3 / 0.001) - 12
    d = batch(w, p, [req("r", PROMPT, max_tokens=500, budget=1.0)], None)[0]
    assert (d.model, d.max_tokens) == ("b", 238)      # floor(1.0 / 0.004) - 12
    d = batch(w, p, [req("r", PROMPT, max_tokens=100, budget=1.0)], None)[0]
    assert d.max_tokens == 100
    err = batch(w, p, [req("r", PROMPT, budget=0.1)], None)[0]
    assert isinstance(err, ValueError) and "below the cheapest predicted cost 0.112" in str(err)


def test_a_rejected_request_does_not_stop_the_batch() -> None:
    w = World({"a0": "a"})
    p = w.build("routebalance", SETTINGS, PredictorSet(
        knn=Estimator({"ok": 10, "poor": 10}, {"a": 0.5, "b": 0.5})))
    ok, poor = batch(w, p, [req("ok", PROMPT), req("poor", PROMPT, budget=0.0)])
    assert ok.instance == "a0" and isinstance(poor, ValueError)


def test_tpot_heads_see_dead_reckoned_state() -> None:
    seen: list[tuple[str, int, int, int]] = []

    class Heads:
        engines = frozenset({"e0", "e1"})

        def tpot_ms(self, queries: Any) -> list[float]:
            seen.extend((q.engine, q.batch_size, q.pending_decode_tokens, q.context_tokens)
                        for q in queries)
            return [10.0 for _ in queries]

    w = World({"e0": "a", "e1": "a"})
    w.load("e1", batch=2, decode=40)
    p = w.build("routebalance", SETTINGS, PredictorSet(
        knn=Estimator({"r1": 50, "r2": 50}, {"a": 0.5, "b": 0.5}), tpot=Heads()))
    batch(w, p, [req("r1", PROMPT), req("r2", PROMPT)])
    assert seen == [("e0", 0, 0, 12), ("e1", 2, 40, 12), ("e0", 1, 50, 12), ("e1", 2, 40, 12)]
