"""Chimera Algorithm 1: latency slack, confidence margin, ties, stickiness, priority."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest

from router.policies.chimera import (ShareMargin, finish_times, first_done, model_latency,
                                     select_model)
from router.predictors.base import ModelProfile, PredictorSet, QualityLength
from tests.unit.test_policies_base import World, req

PROMPT = list(range(100, 112))


def test_model_latency() -> None:
    assert model_latency(inflight_tokens=800, decode_ms_per_token=10, max_batch_size=8) == 1000


@pytest.mark.parametrize("lat_b,expected", [(3.0, "b"), (3.0000001, "a")])
def test_slack_boundary(lat_b: float, expected: str) -> None:
    # L_fast = 2, tau = 0.5: the slack admits L <= 3 (inclusive)
    q = {"a": 0.5, "b": 0.9}
    assert select_model(q, {"a": 2.0, "b": lat_b}, tau=0.5, delta_s=0.25) == expected


@pytest.mark.parametrize("q_b,expected", [(0.75, "b"), (0.7, "a")])
def test_margin_boundary(q_b: float, expected: str) -> None:
    # q* = q[m_fast] = 0.5, delta_s = 0.25: q must reach 0.75 (inclusive)
    assert select_model({"a": 0.5, "b": q_b}, {"a": 2.0, "b": 2.5}, 0.5, 0.25) == expected


def test_walk_takes_the_most_confident_model_within_the_slack() -> None:
    q = {"a": 0.5, "b": 0.9, "c": 0.8}
    lat = {"a": 1.0, "b": 10.0, "c": 1.2}   # b is outside (1 + 0.5) x 1, c inside
    assert select_model(q, lat, 0.5, 0.1) == "c"


def test_fastest_tie_goes_to_the_more_confident_then_the_name() -> None:
    assert select_model({"a": 0.5, "b": 0.7}, {"a": 1.0, "b": 1.0}, 0.2, 0.1) == "b"
    assert select_model({"a": 0.6, "b": 0.6}, {"a": 1.0, "b": 1.0}, 0.2, 0.0) == "a"


def test_walk_ties_in_confidence_go_to_the_faster_model() -> None:
    q = {"a": 0.2, "b": 0.8, "c": 0.8}
    assert select_model(q, {"a": 1.0, "b": 1.4, "c": 1.2}, 0.5, 0.1) == "c"


def test_idle_cluster_picks_the_most_confident_model() -> None:
    q = {"a": 0.5, "b": 0.9}
    assert select_model(q, {"a": 0.0, "b": 0.0}, 0.2, 0.05) == "b"


STATIC: dict[str, Any] = {
    "static_prior": True, "tau": 0.5, "delta_s": 0.1,
    "confidence": {"a": 0.5, "b": 0.9},
    "mean_output_tokens": {"a": 100, "b": 200},
    "decode_ms_per_token": {"a": 10, "b": 40},
    "max_batch_size": {"a": 8, "b": 8},
}


def world() -> World:
    return World({"a0": "a", "b0": "b", "b1": "b"})


def test_decision_uses_inflight_predicted_tokens() -> None:
    w = world()
    p = w.build("chimera", STATIC)
    r = req(tokens=PROMPT, stage_index=1, num_stages=4)
    d = w.decide(p, r)
    # idle: L = 0 everywhere -> b (0.9 >= 0.5 + 0.1); priority = 200 x 3 remaining stages
    assert (d.model, d.priority, d.predicted_remaining_tokens) == ("b", 600, 600.0)
    w.inflight("a0", "a", predicted=800, rid="x1")   # L_a = 800 x 10 / 8 = 1000
    w.inflight("b0", "b", predicted=300, rid="x2")   # L_b = 300 x 40 / 8 = 1500 <= 1.5 x 1000
    assert w.decide(p, r).model == "b"
    w.inflight("b1", "b", predicted=1, rid="x3")     # L_b = 301 x 5 = 1505 > 1500
    d = w.decide(p, r)
    assert (d.model, d.instance, d.info["L_ms"]) == ("a", "a0", 1000.0)


def test_program_sticks_to_its_model() -> None:
    w = world()
    p = w.build("chimera", STATIC)
    w.programs.routed("prog", "a", now=0)
    d = w.decide(p, req(tokens=PROMPT, program_id="prog", stage_index=1, num_stages=2))
    assert (d.model, d.info["sticky"], d.priority, d.final) == ("a", True, 100, True)
    off = w.build("chimera", {**STATIC, "sticky": False})
    assert w.decide(off, req(tokens=PROMPT, program_id="prog")).model == "b"


def test_sticky_model_without_candidates_is_reselected() -> None:
    w = world()
    p = w.build("chimera", STATIC)
    w.programs.routed("prog", "a", now=0)
    r = req(tokens=PROMPT, program_id="prog")
    d = p.decide(r, w.cands("b"), w.view(), asyncio.run(p.predict([r]))[0])
    assert (d.model, d.info["sticky"]) == ("b", False)


def test_replica_within_the_model_by_lmetric() -> None:
    w = world()
    w.cache("b1", PROMPT)
    assert w.decide(w.build("chimera", STATIC), req(tokens=PROMPT)).instance == "b1"


class Router:
    models = frozenset({"a", "b"})

    async def confidence(self, reqs: Any) -> Any:
        return [{"a": 0.95, "b": 0.1} for _ in reqs]


class Length:
    models = frozenset({"a", "b"})

    async def remaining_tokens(self, reqs: Any) -> Any:
        return [{"a": 1234.4, "b": 1.0} for _ in reqs]


def test_profiles_and_predictors_replace_static_tables() -> None:
    w = world()
    preds = PredictorSet(semantic_router=Router(), length=Length(),
                         profiles={"a": ModelProfile(10, 8), "b": ModelProfile(40, 8)})
    p = w.build("chimera", predictors=preds)
    d = w.decide(p, req(tokens=PROMPT))
    assert (d.model, d.priority) == ("a", 1234)
    assert p.sources == {"confidence": "predictor", "remaining_tokens": "predictor",
                         "profile": "predictor"}


def test_missing_profile_says_what_to_profile() -> None:
    preds = PredictorSet(semantic_router=Router(), length=Length(),
                         profiles={"a": ModelProfile(10, 8)})
    with pytest.raises(ValueError, match=r"decode profiles \(decode_ms_per_token, "
                       r"max_batch_size\) of b: profile the engines \(python -m "
                       r"kernels_bench profile\)"):
        world().build("chimera", predictors=preds)


class CountingRouter(Router):
    def __init__(self) -> None:
        self.seen: list[int | None] = []

    async def confidence(self, reqs: Any) -> Any:
        self.seen += [r.workflow.stage_index for r in reqs]
        return await super().confidence(reqs)


def test_semantic_router_runs_on_a_programs_first_call_only() -> None:
    w = world()
    router = CountingRouter()
    preds = PredictorSet(semantic_router=router, length=Length(),
                         profiles={"a": ModelProfile(10, 8), "b": ModelProfile(40, 8)})
    p = w.build("chimera", predictors=preds)
    first, later = (req(tokens=PROMPT, program_id="prog", stage_index=i, num_stages=2)
                    for i in (0, 1))
    alone = req(tokens=PROMPT, stage_index=1)  # no program: nothing to stick to
    got = asyncio.run(p.predict([first, later, alone]))
    assert router.seen == [0, 1] and got[1].q is None and got[0].q == got[2].q
    w.programs.routed("prog", "b", now=0)
    d = p.decide(later, w.cands(), w.view(), got[1])
    assert (d.model, d.info["sticky"], d.info["q"]) == ("b", True, None)
    # the program's model is gone: equal confidences, so the fastest model (idle: the name)
    d = p.decide(later, w.cands("a"), w.view(), got[1])
    assert (d.model, d.info["sticky"]) == ("a", False)
    off = w.build("chimera", {"sticky": False}, predictors=preds)
    router.seen.clear()
    asyncio.run(off.predict([later]))
    assert router.seen == [1]


def test_escalate_walks_the_models_a_retried_stage_has_not_tried() -> None:
    w = world()
    retry = req(tokens=PROMPT, program_id="job.1", attempt=1, tried_models=["b"])
    assert w.decide(w.build("chimera", STATIC), retry).model == "b"  # the paper: q decides
    on = w.build("chimera", {**STATIC, "escalate": True})
    assert w.decide(on, retry).model == "a"
    both = req(tokens=PROMPT, program_id="job.2", attempt=2, tried_models=["a", "b"])
    assert w.decide(on, both).model == "b"  # every model tried: Algorithm 1 over all
    w.programs.routed("job.1", "b", now=0)   # a later stage sticks to its attempt's model
    later = req(tokens=PROMPT, program_id="job.1", stage_index=1, num_stages=2,
                tried_models=["b"])
    assert w.decide(on, later).model == "b"


def test_on_check_m_fast_routes_a_checked_first_attempt_to_the_least_congested() -> None:
    w = world()
    w.inflight("b0", "b", predicted=300, rid="x1")   # L_b = 1500 > L_a = 0: m_fast = a
    on = w.build("chimera", {**STATIC, "on_check": "m_fast"})
    checked = req(tokens=PROMPT, program_id="p", checked=True)
    d = w.decide(on, checked)
    assert (d.model, d.info["q"]) == ("a", None)
    w.inflight("a0", "a", predicted=800, rid="x2")   # L_a = 1000 < 1500: still a
    assert w.decide(on, checked).model == "a"
    w.inflight("a0", "a", predicted=1000, rid="x3")  # L_a = 2250 > 1500: now b
    assert w.decide(on, checked).model == "b"
    # no check, or a retry: the semantic router's q as in the paper
    for r in (req(tokens=PROMPT, program_id="p", checked=False),
              req(tokens=PROMPT, program_id="p", checked=True, tried_models=["a"])):
        assert w.decide(on, r).info["q"] is not None
    assert w.decide(w.build("chimera", STATIC), checked).info["q"] == 0.9


@pytest.mark.parametrize("rule", ["m_fast", "first_done"])
def test_on_check_skips_the_semantic_router_on_a_checked_first_attempt(rule: str) -> None:
    router = CountingRouter()
    preds = PredictorSet(semantic_router=router, length=Length(),
                         profiles={"a": ModelProfile(10, 8), "b": ModelProfile(40, 8)})
    p = world().build("chimera", {"on_check": rule}, predictors=preds)
    reqs = [req(tokens=PROMPT, checked=True, stage_index=2),
            req(tokens=PROMPT, checked=False, stage_index=3),
            req(tokens=PROMPT, checked=True, tried_models=["a"], stage_index=4)]
    got = asyncio.run(p.predict(reqs))
    assert router.seen == [3, 4] and [g.q is None for g in got] == [True, False, False]


def test_first_done_adds_the_programs_own_tokens_to_the_congestion() -> None:
    # a: L 1000 + 100 x 10 = 2000; b: L 0 + 200 x 40 = 8000 (STATIC's tables)
    assert first_done({"a": 1000.0, "b": 0.0}, {"a": 100.0, "b": 200.0},
                      {"a": 10.0, "b": 40.0}) == "a"
    assert first_done({"a": 7000.0, "b": 0.0}, {"a": 100.0, "b": 200.0},
                      {"a": 10.0, "b": 40.0}) == "a"          # 8000 = 8000: the name
    assert first_done({"a": 7001.0, "b": 0.0}, {"a": 100.0, "b": 200.0},
                      {"a": 10.0, "b": 40.0}) == "b"
    assert first_done({"a": 0.0, "b": 0.0}, {"a": 4.0, "b": 1.0},
                      {"a": 1.0, "b": 4.0}) == "a"            # a tie goes to the name


def test_on_check_first_done_routes_a_checked_first_attempt() -> None:
    w = world()
    on = w.build("chimera", {**STATIC, "on_check": "first_done"})
    checked = req(tokens=PROMPT, program_id="p", checked=True)
    d = w.decide(on, checked)                     # idle: a ends first (1000 < 8000 ms)
    assert (d.model, d.info["q"]) == ("a", None)
    # no check: the semantic router's q (0.9 >= 0.5 + 0.1 on an idle cluster)
    assert w.decide(on, req(tokens=PROMPT, program_id="p", checked=False)).model == "b"
    w.inflight("a0", "a", predicted=6000, rid="x1")  # L_a = 7500: 8500 > 8000
    assert w.decide(on, checked).model == "b"
    w.inflight("b0", "b", predicted=1, rid="x2")     # L_b = 5: 8005 < 8500, still b
    assert w.decide(on, checked).model == "b"
    # a retry: Algorithm 1 on q, as in the paper
    retry = req(tokens=PROMPT, program_id="p.1", checked=True, tried_models=["b"])
    assert w.decide(on, retry).info["q"] is not None


def test_latency_finish_makes_delta_s_a_threshold_on_an_idle_cluster() -> None:
    w = world()
    assert finish_times({"a": 0.0, "b": 5.0}, {"a": 100.0, "b": 200.0},
                        {"a": 10.0, "b": 40.0}) == {"a": 1000.0, "b": 8005.0}
    r = req(tokens=PROMPT, program_id="p")
    # idle, congestion (the paper's): L = 0 for both, the tie goes to b (q 0.9)
    assert w.decide(w.build("chimera", STATIC), r).model == "b"
    # finish times a 100 x 10 = 1000, b 200 x 40 = 8000 ms: a is m_fast; with tau 7 b is
    # within the slack (8000 <= 8 x 1000) and 0.9 >= 0.5 + delta_s decides
    wide = {**STATIC, "latency": "finish", "tau": 7.0}
    assert w.decide(w.build("chimera", {**wide, "delta_s": 0.4}), r).model == "b"
    assert w.decide(w.build("chimera", {**wide, "delta_s": 0.41}), r).model == "a"
    # the paper's slack (tau 0.5) keeps the slow model out whatever its q
    assert w.decide(w.build("chimera", {**STATIC, "latency": "finish"}), r).model == "a"
    with pytest.raises(ValueError, match="latency"):
        w.build("chimera", {**STATIC, "latency": "e2e"})


def test_on_check_names_its_rules() -> None:
    with pytest.raises(ValueError, match="on_check"):
        world().build("chimera", {**STATIC, "on_check": "fastest"})


class Knn:
    models = frozenset({"a", "b"})

    async def estimate(self, reqs: Any) -> Any:
        return [{"a": QualityLength(0.2, 50.0), "b": QualityLength(0.9, 60.0)} for _ in reqs]


def test_quality_knn_reads_the_knn_estimators_quality_as_q() -> None:
    w = world()
    profiles = {"a": ModelProfile(10, 8), "b": ModelProfile(40, 8)}
    preds = PredictorSet(semantic_router=Router(), length=Length(), knn=Knn(),
                         profiles=profiles)
    paper = w.build("chimera", predictors=preds)
    knn = w.build("chimera", {"quality": "knn"}, predictors=preds)
    r = req(tokens=PROMPT)
    assert asyncio.run(paper.predict([r]))[0].q == {"a": 0.95, "b": 0.1}
    got = asyncio.run(knn.predict([r]))[0]
    assert got.q == {"a": 0.2, "b": 0.9}
    assert (w.decide(paper, r).model, knn.decide(r, w.cands(), w.view(), got).model) == ("a", "b")
    with pytest.raises(ValueError, match=r"python -m router.train knn.*quality = \"knn\""):
        w.build("chimera", {"quality": "knn"},
                predictors=PredictorSet(semantic_router=Router(), length=Length(),
                                        profiles=profiles))
    with pytest.raises(ValueError):
        w.build("chimera", {"quality": "capability"}, predictors=preds)


def test_share_margin_is_the_quantile_of_the_gains_before_the_call() -> None:
    m = ShareMargin(share=0.25, window=4, initial=0.3)
    # positions 0.75 (n + 1) beyond the n gains seen (n < 3): delta_s itself
    assert [m.next(g) for g in (0.1, 0.5, 0.2)] == [0.3, 0.3, 0.3]
    assert m.next(0.3) == pytest.approx(0.5)        # n = 3: the 3rd smallest
    m.next(0.4)
    # the window holds the last 4 (0.5, 0.2, 0.3, 0.4): their 75% quantile
    assert list(m.gains) == [0.5, 0.2, 0.3, 0.4]
    # positions p(n + 1): 0.75 x 5 = 3.75, between the 3rd and 4th smallest
    assert m.next(0.0) == pytest.approx(0.4 + 0.75 * (0.5 - 0.4))


def test_share_margin_is_numpys_weibull_quantile_of_the_window() -> None:
    """Over a window that fills, evicts and holds ties, each margin is
    ``np.quantile(window, 1 - share, method="weibull")`` wherever the position lies
    inside it; a non-finite gain is not recorded."""
    rng = np.random.default_rng(5)
    for share in (0.1, 0.3, 0.5, 0.9):
        m = ShareMargin(share, window=17, initial=-9.0)
        for g in rng.choice(np.round(rng.normal(size=12), 1), 300):  # ties
            before = list(m.gains)
            n = len(before)
            want = (float(np.quantile(before, 1 - share, method="weibull"))
                    if 1 <= (1 - share) * (n + 1) <= n else -9.0)
            assert m.next(float(g)) == pytest.approx(want)
            assert m.ranked == sorted(m.gains)
    kept = list(m.gains)
    for bad in (float("nan"), float("inf"), float("-inf")):
        m.next(bad)
    assert list(m.gains) == kept and m.ranked == sorted(kept)


def test_share_margin_holds_the_share_from_a_few_calls_on() -> None:
    """Runs of 20 calls (a twin fold): the share of calls whose gain reaches the margin
    stays within 2 points of ``share`` on average (p(n - 1) positions: 6 over), the
    first calls on an initial margin that would send 25%."""
    rng = np.random.default_rng(11)
    shares = []
    for _ in range(500):
        m = ShareMargin(0.25, window=200, initial=0.674)  # N(0, 1)'s 75% quantile
        gains = rng.normal(0.0, 1.0, 20)
        shares.append(np.mean([g >= m.next(g) for g in gains]))
    assert abs(np.mean(shares) - 0.25) < 0.02


@pytest.mark.parametrize("share", [0.2, 0.35, 0.5])
def test_share_margin_holds_the_share_where_a_fixed_margin_drifts(share: float) -> None:
    """Gains from a distribution shifted from the one a fixed margin was set on: the
    fixed margin's share moves with it, the held one stays near ``share``."""
    rng = np.random.default_rng(7)
    fixed = float(np.quantile(rng.normal(0.0, 0.2, 5000), 1 - share))  # set on "training"
    new = rng.normal(0.1, 0.2, 4000)                                    # new problems
    held = ShareMargin(share, window=200, initial=fixed)
    reached = [g >= held.next(g) for g in new]
    assert abs(np.mean(reached) - share) < 0.03
    assert np.mean(new >= fixed) - share > 0.1


class Gains:
    """Confidences that differ per prompt (its first token): b's gain over a is
    (token - 100) / 100 - 0.4, from -0.4 to +0.59 over tokens 100-199."""
    models = frozenset({"a", "b"})

    async def confidence(self, reqs: Any) -> Any:
        return [{"a": 0.4, "b": (r.prompt_token_ids[0] - 100) / 100} for r in reqs]


class Tokens:
    """a ends a program first (100 x 10 ms against 200 x 40 ms): m_fast when idle."""
    models = frozenset({"a", "b"})

    async def remaining_tokens(self, reqs: Any) -> Any:
        return [{"a": 100.0, "b": 200.0} for _ in reqs]


def gain_predictors() -> PredictorSet:
    return PredictorSet(semantic_router=Gains(), length=Tokens(),
                        profiles={"a": ModelProfile(10, 8), "b": ModelProfile(40, 8)})


def test_target_share_holds_the_share_past_m_fast_on_finish_times() -> None:
    w = world()
    preds = gain_predictors()
    base = {"latency": "finish", "tau": 1000.0, "delta_s": 0.0, "sticky": False}
    rng = random.Random(3)
    tokens = [rng.randrange(100, 200) for _ in range(400)]

    def share(settings: dict[str, Any]) -> float:
        p = w.build("chimera", {**base, **settings}, predictors=preds)
        return float(np.mean([w.decide(p, req(tokens=[t, 1, 2])).model == "b"
                              for t in tokens]))

    assert share({}) > 0.5                          # delta_s 0: every positive gain
    assert abs(share({"target_share": 0.3}) - 0.3) < 0.05
    assert abs(share({"target_share": 0.1}) - 0.1) < 0.05


def test_target_share_counts_first_calls_only() -> None:
    w = world()
    preds = gain_predictors()
    p = w.build("chimera", {"latency": "finish", "tau": 1000.0, "target_share": 0.5,
                            "escalate": True}, predictors=preds)
    w.decide(p, req(tokens=[150]))
    w.decide(p, req(tokens=[160], program_id="job.1", attempt=1, tried_models=["a"]))
    w.programs.routed("prog", "a", now=0)
    w.decide(p, req(tokens=[170], program_id="prog", stage_index=1, num_stages=2))
    assert list(p.margin.gains) == [pytest.approx(0.1)]   # the retry and the later stage: no
    for share in (0.0, 1.0, 1.5):  # 0 and 1 would never leave delta_s
        with pytest.raises(ValueError, match="target_share"):
            w.build("chimera", {"target_share": share})
    with pytest.raises(ValueError, match="share_window"):
        w.build("chimera", {"share_window": 0})
