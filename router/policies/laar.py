"""``laar``: LAAR (section 5), routing by expected time to a correct answer.

  cost(m | x) = L(m, x) / Q'(m, x)                      lowest wins
  L(m, x)     = c(m) x (T(x) + alpha x R(m))            alpha = 0.7
  Q'(m, x)    = Q(m, x) x (1 - retry_penalty)^k_m       retry penalty, stateless:
                k_m = times m appears in the request's tried models
with Q(m, x) the capability model's probability that m answers x correctly (1/Q is the
expected number of attempts), c(m) the model's time per token (decode_ms_per_token),
T(x) the request's prompt tokens and R(m) the model's mean response tokens.
A model with Q' = 0 costs infinity. Ties: lower L, then the name. The engine within
the model is chosen by the ``picker`` setting's engine picker (default ``lmetric``).
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Mapping, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import (BuildPolicy, PickerPolicy, decision, models_of, of_model,
                                  resolve)
from router.policies.pickers import PickerName
from router.predictors.base import StaticCapability
from router.settings import STRICT, Fraction, NonNegative, Positive
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class LaarSettings:
    alpha: NonNegative = 0.7
    """alpha: weight of the response term R(m) (LAAR: 0.7)."""
    retry_penalty: Fraction = 0.5
    """Fraction of Q(m, x) lost per earlier attempt of m on this request (chosen here)."""
    static_prior: bool = False
    capability: dict[str, Fraction] = field(default_factory=dict)
    """Static Q(m, x) = Q(m) per model."""
    decode_ms_per_token: dict[str, Positive] = field(default_factory=dict)
    """Static c(m)."""
    mean_output_tokens: dict[str, Positive] = field(default_factory=dict)
    """Static R(m)."""
    picker: PickerName = "lmetric"
    """The engine picker that chooses among the chosen model's engines
    (``router.policies.pickers``; docs/policies.md)."""


def laar_latency(c_m: float, t_x: float, r_m: float, alpha: float) -> float:
    """L(m, x) = c(m) x (T(x) + alpha x R(m))."""
    return c_m * (t_x + alpha * r_m)


def retry_quality(q: float, tries: int, retry_penalty: float) -> float:
    """Q'(m, x) = Q(m, x) x (1 - retry_penalty)^k_m."""
    return q * (1 - retry_penalty) ** tries


def laar_cost(latency: float, quality: float) -> float:
    """cost(m | x) = L / Q' (infinite when Q' = 0)."""
    return latency / quality if quality > 0 else math.inf


class Laar(PickerPolicy[LaarSettings]):
    name = "laar"
    program_affinity = True
    predictors_used = ("capability",)
    Settings = LaarSettings
    default_picker = "lmetric"

    def __init__(self, settings: LaarSettings, cluster: Any, predictors: Any,
                 build: BuildPolicy) -> None:
        super().__init__(settings, cluster, predictors, build)
        s, models = settings, cluster.models
        self.q_source, self.sources["capability"] = resolve(
            self.name, "the capability model Q(m, x)", predictors.capability,
            getattr(predictors.capability, "models", None), models,
            "train the capability model (python -m router.train capability) and set "
            "router.predictors.capability", s.static_prior,
            {"capability": s.capability}, lambda: StaticCapability(s.capability))
        profiles = predictors.profiles
        unprofiled = [m for m in models
                      if m not in profiles or profiles[m].mean_output_tokens is None]
        if not unprofiled:
            self.c = {m: profiles[m].decode_ms_per_token for m in models}
            self.r = {m: float(profiles[m].mean_output_tokens or 0) for m in models}
            self.sources["profile"] = "predictor"
        else:
            _, self.sources["profile"] = resolve(
                self.name, f"c(m) and R(m) (decode_ms_per_token, mean_output_tokens) of "
                f"{', '.join(unprofiled)}", None, None, models,
                "profile the engines on a trace (python -m kernels_bench "
                "profile) and set router.predictors.profiles", s.static_prior,
                {"decode_ms_per_token": s.decode_ms_per_token,
                 "mean_output_tokens": s.mean_output_tokens}, lambda: None)
            self.c, self.r = dict(s.decode_ms_per_token), dict(s.mean_output_tokens)

    async def predict(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return await self.q_source.capability(reqs)

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Mapping[str, float]) -> Decision:
        s = self.settings
        tried = req.workflow.tried_models
        lat, cost = {}, {}
        for m in models_of(cands):
            lat[m] = laar_latency(self.c[m], req.num_prompt_tokens, self.r[m], s.alpha)
            cost[m] = laar_cost(lat[m], retry_quality(pred[m], tried.count(m), s.retry_penalty))
        model = min(cost, key=lambda m: (cost[m], lat[m], m))
        pick = self.picker.pick(req, of_model(cands, model), view)
        return decision(req, pick.engine, self.name,
                        info={"Q": pred[model], "L_ms": lat[model], "cost": cost[model],
                              **pick.info})
