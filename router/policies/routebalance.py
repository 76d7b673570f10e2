"""``routebalance``: RouteBalance (section 4), batched joint model + instance assignment.

Per request r and candidate instance i (serving model m):
  q-hat(m, r), l-hat(m, r)   KNN estimator: quality and output length (section 4.2)
  tau_i                      the instance's TPOT head (ms per output token)
  c(i, r)   = price[m] x (P_r + l-hat(m, r))                       predicted cost
  lat(i, r) = (D_i / b_i + l-hat(m, r)) x tau_i                    predicted latency
            D_i / b_i: iterations waited for a slot, from the pending decode tokens D_i
            of the b_i running requests (0 when idle), then the request's own decode
  S(i, r)   = w_q q-hat - w_c c / max_c - w_l lat / max_l          highest wins
            max_c, max_l over r's candidates; (w_q, w_c, w_l) on the simplex.
Batch: requests collected over an adaptive window are ordered longest predicted output
first (LPT: max over models of l-hat) and assigned greedily; after each assignment the
chosen instance's local state is advanced (dead reckoning: D_i += l-hat, b_i += 1).
Budget (per request): instances whose predicted cost exceeds it are filtered out
(admission) and max_tokens is clamped to what the remaining budget pays for.
Ties: lower latency, then fewer (dead-reckoned) running requests, then the name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import BuildPolicy, Policy, decision, models_of, resolve
from router.predictors.base import QualityLength, StaticQualityLength, StaticTpot, TpotQuery
from router.settings import STRICT, Fraction, NonNegative, Positive, PositiveInt, check
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest

WEIGHT_KEYS = ("quality", "cost", "latency")
"""Names of per-request weights (``workflow.weights``)."""


@pydantic_dataclass(frozen=True, config=STRICT)
class RouteBalanceSettings:
    w_quality: NonNegative = 1 / 3
    """w_q; the default is the balanced preset (equal weights)."""
    w_cost: NonNegative = 1 / 3
    w_latency: NonNegative = 1 / 3
    max_batch: PositiveInt = 8
    """Largest batch (RouteBalance's scheduler_config_default: 8)."""
    max_window_ms: NonNegative = 100.0
    """Longest collection window (RouteBalance's batch_timeout_ms: 100)."""
    cost_per_token: dict[str, NonNegative] = field(default_factory=dict)
    """Price per prompt or output token of each model (required: a price list)."""
    static_prior: bool = False
    quality: dict[str, Fraction] = field(default_factory=dict)
    mean_output_tokens: dict[str, Positive] = field(default_factory=dict)
    decode_ms_per_token: dict[str, Positive] = field(default_factory=dict)

    def __post_init__(self) -> None:
        total = self.w_quality + self.w_cost + self.w_latency
        check("w_quality", abs(total - 1) < 1e-6,
              f"w_quality + w_cost + w_latency must be 1 (the simplex), got {total:g}")


@dataclass(frozen=True)
class Weights:
    quality: float
    cost: float
    latency: float


def request_weights(override: Mapping[str, float], default: Weights) -> Weights:
    """Per-request weights, normalised onto the simplex (ValueError on bad input)."""
    if not override:
        return default
    unknown = sorted(set(override) - set(WEIGHT_KEYS))
    if unknown:
        raise ValueError(f"unknown workflow weight '{unknown[0]}'; routebalance weights are "
                         f"{', '.join(WEIGHT_KEYS)}")
    w = {k: float(override.get(k, getattr(default, k))) for k in WEIGHT_KEYS}
    total = sum(w.values())
    if any(v < 0 for v in w.values()) or not total > 0:
        raise ValueError("workflow weights must be >= 0 with a positive sum")
    return Weights(**{k: v / total for k, v in w.items()})


def predicted_cost(price: float, prompt_tokens: int, output_tokens: float) -> float:
    """c(i, r) = price[m] x (P_r + l-hat)."""
    return price * (prompt_tokens + output_tokens)


def predicted_latency_ms(decode_tokens: float, batch_size: int, output_tokens: float,
                         tpot_ms: float) -> float:
    """lat(i, r) = (D_i / b_i + l-hat) x tau_i."""
    waiting_iterations = decode_tokens / batch_size if batch_size > 0 else 0.0
    return (waiting_iterations + output_tokens) * tpot_ms


def score(quality: float, cost: float, latency: float, max_cost: float, max_latency: float,
          w: Weights) -> float:
    """S = w_q q - w_c c / max_c - w_l lat / max_l (a term is 0 when its max is 0)."""
    return (w.quality * quality - (w.cost * cost / max_cost if max_cost > 0 else 0.0)
            - (w.latency * latency / max_latency if max_latency > 0 else 0.0))


def lpt_order(lengths: Sequence[float]) -> list[int]:
    """Indices by descending predicted length; equal lengths keep arrival order."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def budget_max_tokens(budget: float, price: float, prompt_tokens: int) -> int | None:
    """Output tokens the budget pays for after the prompt (``None``: free model)."""
    if price <= 0:
        return None
    return math.floor(budget / price + 1e-9) - prompt_tokens


@dataclass
class Reckoned:
    """An instance's state as the batch's assignments advance it (dead reckoning)."""

    decode_tokens: float
    """D_i: pending decode tokens."""
    batch_size: int
    """b_i: running requests."""

    def advance(self, output_tokens: float) -> None:
        """One more request assigned: D_i += l-hat, b_i += 1."""
        self.decode_tokens += output_tokens
        self.batch_size += 1


class AdaptiveWindow:
    """The collection window: just long enough to fill a batch at the current rate.

    With g the smoothed inter-arrival gap, the target batch is
    n = clamp(max_window / g, 1, max_batch) and the window (n - 1) x g: no wait when
    requests are sparse, a full batch's worth of arrivals under load.
    """

    SMOOTHING = 0.2

    def __init__(self, max_batch: int, max_window_s: float) -> None:
        self.max_batch, self.max_window_s = max_batch, max_window_s
        self.gap_s: float | None = None
        self._last: float | None = None

    def arrival(self, now: float) -> None:
        if self._last is not None:
            gap = now - self._last
            self.gap_s = gap if self.gap_s is None else \
                self.SMOOTHING * gap + (1 - self.SMOOTHING) * self.gap_s
        self._last = now

    def window_s(self) -> float:
        if self.gap_s is None:
            return 0.0
        if self.gap_s <= 0:
            return self.max_window_s
        target = min(self.max_batch, max(1, math.floor(self.max_window_s / self.gap_s)))
        return min(self.max_window_s, (target - 1) * self.gap_s)


class RouteBalance(Policy[RouteBalanceSettings]):
    name = "routebalance"
    predictors_used = ("knn", "tpot")
    Settings = RouteBalanceSettings
    inputs = frozenset({"decode_tokens", "batch_size", "unreported_requests", "kv_usage"})

    def __init__(self, settings: RouteBalanceSettings, cluster: Any, predictors: Any,
                 build: BuildPolicy) -> None:
        super().__init__(settings, cluster, predictors, build)
        s, models = settings, cluster.models
        missing = [m for m in models if m not in s.cost_per_token]
        if missing:
            raise ValueError(f"router.policies.routebalance.cost_per_token: no price for "
                             f"{', '.join(missing)} (set 0 for a free model)")
        self.estimator, self.sources["quality_length"] = resolve(
            self.name, "per-model quality and output length", predictors.knn,
            getattr(predictors.knn, "models", None), models,
            "build the KNN estimator (python -m router.train knn) and set "
            "router.predictors.knn", s.static_prior,
            {"quality": s.quality, "mean_output_tokens": s.mean_output_tokens},
            lambda: StaticQualityLength(s.quality, s.mean_output_tokens))
        self.tpot, self.sources["tpot"] = resolve(
            self.name, "per-engine TPOT heads", predictors.tpot,
            getattr(predictors.tpot, "engines", None), sorted(cluster.engine_models),
            "train the latency heads (python -m router.train tpot) and set "
            "router.predictors.tpot", s.static_prior,
            {"decode_ms_per_token": s.decode_ms_per_token},
            lambda: StaticTpot(cluster.engine_models, s.decode_ms_per_token), models)
        self.tpot_of: dict[str, str] = {}
        """An engine added while running -> the engine whose TPOT head it uses."""
        self.default_weights = Weights(s.w_quality, s.w_cost, s.w_latency)
        self.window: AdaptiveWindow = AdaptiveWindow(s.max_batch, s.max_window_ms / 1e3)

    def add_engine(self, name: str, model: str, like: str) -> None:
        """A new replica's TPOT is predicted with the head of ``like`` (same model; the
        heads are per engine, trained on each one's telemetry)."""
        self.tpot_of[name] = self.tpot_of.get(like, like)

    def remove_engine(self, name: str) -> None:
        self.tpot_of.pop(name, None)

    async def predict(self, reqs: Sequence[RoutingRequest]
                      ) -> list[Mapping[str, QualityLength]]:
        return await self.estimator.estimate(reqs)

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Mapping[str, QualityLength]) -> Decision:
        result = self.decide_batch([req], [cands], view, [pred])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def decide_batch(self, reqs: Sequence[RoutingRequest],
                     cands: Sequence[Sequence[EngineView]], view: StateView,
                     preds: Sequence[Mapping[str, QualityLength]]
                     ) -> list[Decision | ValueError]:
        """LPT order, greedy assignment, dead reckoning; a request whose budget no
        candidate meets gets a ValueError in its slot."""
        viewed = [list(cs) for cs in cands]
        local = {e.name: Reckoned(e.decode_tokens, e.batch_size + e.unreported_requests)
                 for cs in viewed for e in cs}
        lengths = [max(p[m].output_tokens for m in models_of(cs)) for p, cs in zip(preds, cands)]
        out: dict[int, Decision | ValueError] = {}
        for rank, i in enumerate(lpt_order(lengths)):
            try:
                out[i] = self._assign(reqs[i], viewed[i], preds[i], local, rank)
            except ValueError as exc:
                out[i] = exc
        return [out[i] for i in range(len(reqs))]

    def _assign(self, req: RoutingRequest, cands: list[EngineView],
                pred: Mapping[str, QualityLength], local: dict[str, Reckoned],
                rank: int) -> Decision:
        """Cost and budget are per model (the same for each of its engines); latency and
        score per engine."""
        w = request_weights(req.workflow.weights, self.default_weights)
        price = self.settings.cost_per_token
        prompt, budget = req.num_prompt_tokens, req.workflow.budget
        models = {e.model for e in cands}
        cost = {m: predicted_cost(price[m], prompt, pred[m].output_tokens) for m in models}
        cap: dict[str, int | None] = {}
        admitted = cands
        if budget is not None:
            cap = {m: budget_max_tokens(budget, price[m], prompt) for m in models}
            fits = {m for m in models if cost[m] <= budget and ((c := cap[m]) is None or c >= 1)}
            admitted = [e for e in cands if e.model in fits]
        if not admitted:
            raise ValueError(f"cost budget {budget:g} is below the cheapest predicted cost "
                             f"{min(cost.values()):g} of this request on any candidate model")
        states = [local[e.name] for e in admitted]
        tpots = self.tpot.tpot_ms([TpotQuery(self.tpot_of.get(e.name, e.name), s.batch_size,
                                             int(s.decode_tokens), prompt, e.kv_usage)
                                   for e, s in zip(admitted, states)])
        lat = [predicted_latency_ms(s.decode_tokens, s.batch_size, pred[e.model].output_tokens, t)
               for e, s, t in zip(admitted, states, tpots)]
        max_c = max(cost[e.model] for e in admitted)
        max_l = max(lat)
        keys = [(-score(pred[e.model].quality, cost[e.model], lat_i, max_c, max_l, w), lat_i,
                 s.batch_size) for e, s, lat_i in zip(admitted, states, lat)]
        k = min(range(len(keys)), key=keys.__getitem__)
        best = admitted[k]
        est = pred[best.model]
        states[k].advance(est.output_tokens)
        max_tokens = cap.get(best.model)
        if max_tokens is not None and req.max_tokens is not None:
            max_tokens = min(max_tokens, req.max_tokens)
        return decision(req, best, self.name, predicted_remaining_tokens=est.output_tokens,
                        max_tokens=max_tokens,
                        info={"quality": est.quality, "cost": cost[best.model],
                              "latency_ms": lat[k], "lpt_rank": rank})
