"""LAAR: L/Q with L = c(m)(T(x) + alpha R(m)) and the stateless retry penalty."""

from __future__ import annotations

import math
from typing import Any

import pytest

from router.policies.laar import laar_cost, laar_latency, retry_quality
from router.predictors.base import ModelProfile, PredictorSet
from tests.unit.test_policies_base import World, req

PROMPT = list(range(100, 112))   # T(x) = 12

# L_a = 10 x (12 + 0.7 x 100) = 820, cost 820 / 0.5 = 1640
# L_b = 20 x (12 + 0.7 x 100) = 1640, cost 1640 / 0.9 = 1822.2
STATIC: dict[str, Any] = {"static_prior": True, "capability": {"a": 0.5, "b": 0.9},
                          "decode_ms_per_token": {"a": 10, "b": 20},
                          "mean_output_tokens": {"a": 100, "b": 100}}


def test_formulas() -> None:
    assert laar_latency(c_m=10, t_x=100, r_m=200, alpha=0.7) == pytest.approx(2400)
    assert retry_quality(0.8, tries=2, retry_penalty=0.5) == pytest.approx(0.2)
    assert retry_quality(0.8, tries=0, retry_penalty=0.5) == 0.8
    assert laar_cost(2400, 0.8) == pytest.approx(3000)
    assert laar_cost(2400, 0.0) == math.inf


def world() -> World:
    return World({"a0": "a", "b0": "b"})


def test_lowest_time_to_correct_answer_wins() -> None:
    w = world()
    d = w.decide(w.build("laar", STATIC), req(tokens=PROMPT))
    assert (d.model, d.info["L_ms"], d.info["cost"]) == ("a", pytest.approx(820),
                                                         pytest.approx(1640))


def test_retry_penalty_moves_away_from_a_tried_model() -> None:
    w = world()
    p = w.build("laar", STATIC)
    # a tried once: Q' = 0.5 x 0.5 = 0.25, cost 3280 > 1822.2
    assert w.decide(p, req(tokens=PROMPT, attempt=2, tried_models=["a"])).model == "b"
    # both tried once: 3280 vs 1640 / 0.45 = 3644.4 -> a again
    assert w.decide(p, req(tokens=PROMPT, attempt=3, tried_models=["a", "b"])).model == "a"
    none = w.build("laar", {**STATIC, "retry_penalty": 0.0})
    assert w.decide(none, req(tokens=PROMPT, tried_models=["a"])).model == "a"


def test_zero_quality_everywhere_falls_back_to_lower_latency() -> None:
    w = world()
    p = w.build("laar", {**STATIC, "retry_penalty": 1.0})
    assert w.decide(p, req(tokens=PROMPT, tried_models=["a", "b"])).model == "a"


def test_alpha_weights_the_response_term() -> None:
    w = world()
    # R_b much shorter: L_a = 10 x (12 + 100 a), L_b = 20 x (12 + 10 a)
    s = {**STATIC, "mean_output_tokens": {"a": 100, "b": 10}}
    assert w.decide(w.build("laar", s), req(tokens=PROMPT)).model == "b"      # 820/.5 vs 380/.9
    s0 = {**s, "alpha": 0.0}                                                   # 240 vs 266.7
    assert w.decide(w.build("laar", s0), req(tokens=PROMPT)).model == "a"


def test_capability_model_and_profiles_replace_static_tables() -> None:
    class Capability:
        models = frozenset({"a", "b"})

        async def capability(self, reqs: Any) -> Any:
            return [{"a": 0.1, "b": 0.9} for _ in reqs]

    w = world()
    p = w.build("laar", predictors=PredictorSet(
        capability=Capability(),
        profiles={"a": ModelProfile(10, 8, 100.0), "b": ModelProfile(20, 8, 100.0)}))
    assert w.decide(p, req(tokens=PROMPT)).model == "b"
    assert p.sources == {"capability": "predictor", "profile": "predictor"}
