"""``chimera``: Chimera's load balancer (Algorithm 1) with STJF priorities.

Inputs per candidate model m: the semantic router's confidence q[m] (section 3.3), the
predicted total remaining output tokens of the workflow P-hat[m] (section 3.4), the
activity monitor's in-flight predicted tokens P_m (section 3.5) and the model's decode
profile (decode_ms_per_token[m], max_batch_size[m], from kernels_bench).

  L[m]   = P_m x decode_ms_per_token[m] / max_batch_size[m]   (congestion estimate)
  m_fast = argmin_m L[m];  q* = q[m_fast]
  walk m by descending q[m]: take the first m with
         L[m] <= (1 + tau) x L[m_fast]   (latency slack)
     and q[m] >= q* + delta_s            (confidence margin over the fastest model);
  none qualifies -> m_fast.
A program's later stages reuse the model its first stage got (stickiness), so the
semantic router runs on a program's first call only (a later stage whose model is gone is
routed with equal confidences: to m_fast).
Two settings read what the agent says (issue 30, "the signal the workflow itself
produces"; off by default, the paper has neither): ``escalate`` walks a retried call
(``workflow.tried_models``) over the models its stage has not tried yet; ``on_check``
routes a first attempt whose agent checks its answer (``workflow.checked``) without the
semantic router: with a retry behind the check, the program ends correct with about the
same probability whichever model answers first (independent attempts), so latency alone
separates them (``m_fast``, or the model expected to end it first, ``first_done``:
argmin_m L[m] + P-hat[m] x decode_ms_per_token[m]). The engine within the model is chosen by
the ``picker`` setting's engine picker (default ``lmetric``); the request's priority is
P-hat[m].
``quality = "knn"`` (ours; the paper's is the semantic router) takes q[m] from the KNN
estimator's quality instead. ``latency = "finish"`` (ours) walks on the program's expected
finish time L[m] + P-hat[m] x decode_ms_per_token[m] instead of L[m]: on an idle cluster
every L[m] is 0, the tie goes to the most confident model, and delta_s and tau act only
under load; on finish times the faster model is m_fast when idle too, and delta_s becomes
a threshold on the predicted gain q[m] - q[m_fast]. ``target_share`` (ours) holds the share
of programs sent past m_fast instead of a fixed margin: delta_s follows the quantile of
recent predicted gains (``ShareMargin``).
Ties: m_fast prefers higher q, then the name; the walk prefers lower L, then the name.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping, Sequence

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import (BuildPolicy, PickerPolicy, decision, models_of, of_model,
                                  priority_for, resolve)
from router.policies.pickers import PickerName
from router.predictors.base import (KnnConfidence, StaticConfidence,
                                   StaticRemainingTokens)
from router.predictors.service import Served
from router.settings import STRICT, Fraction, NonNegative, Positive, PositiveInt
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class ChimeraSettings:
    tau: NonNegative = 0.2
    """Latency slack tau of Algorithm 1 (``select_model``; default chosen here: the paper's
    value could not be checked offline). A cluster tunes it on training problems
    (docs/research/replay.md, "Choosing tau and delta_s")."""
    delta_s: Fraction = 0.05
    """Confidence margin delta_s of Algorithm 1 (``select_model``; as for tau)."""
    sticky: bool = True
    """Reuse a program's model for its later stages (section 3.5)."""
    escalate: bool = False
    """A retried call goes to a model its stage has not tried (``workflow.tried_models``),
    the walk of Algorithm 1 over those only (FrugalGPT's cascade, arXiv 2305.05176, section
    3); every model once tried, over all."""
    on_check: Literal["q", "m_fast", "first_done"] = "q"
    """How a first attempt whose agent checks its answer (``workflow.checked``) is routed:
    ``q``, by the semantic router like any call (the paper); ``m_fast``, with equal
    confidences (Algorithm 1 then takes the least congested model); ``first_done``, to the
    model expected to end it first (``first_done`` below)."""
    quality: Literal["semantic_router", "knn"] = "semantic_router"
    """Where q[m] comes from: the semantic router (the paper's), or the quality estimate of
    the KNN estimator (``router.predictors.knn``, RouteBalance section 4.2), which on math
    recognises a problem's template (docs/research/predictors.md, "Math's templates")."""
    latency: Literal["congestion", "finish"] = "congestion"
    """The latency Algorithm 1 compares: ``congestion``, the paper's L[m]
    (``model_latency``); ``finish``, the program's expected finish time on m
    (``finish_times``: L[m] plus its own predicted tokens at one decode step each), so
    that delta_s separates the models on an idle cluster too (docs/research/predictors.md,
    "Chimera's margin on finish times")."""
    target_share: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Hold near this value the share of semantically routed first calls that Algorithm 1
    may send past m_fast (ours; None: the fixed delta_s). On ``latency = "finish"`` at low
    load m_fast is the faster model, so this is the slower (bigger) model's share, which
    sets the E2E per token; a fixed delta_s lets it drift with the problems' predicted
    gains (docs/research/predictors.md, "Holding the big model's share"). Per decision delta_s is
    the (1 - target_share) quantile of the predicted gains of the last ``share_window``
    such calls (``ShareMargin``), delta_s itself before the first. The slack tau still
    gates each call, so it holds at most about that share: on the CPU pair, whose slow
    engine is 6.5x slower per token, 0.30 held 0.09 (docs/research/results.md)."""
    share_window: Annotated[int, Field(ge=1, le=100_000)] = 200
    """How many recent predicted gains ``target_share``'s quantile is taken over."""
    static_prior: bool = False
    """Use the tables below instead of missing predictors / profiles."""
    confidence: dict[str, Fraction] = field(default_factory=dict)
    """Static q[m] per model."""
    mean_output_tokens: dict[str, Positive] = field(default_factory=dict)
    """Static P-hat[m] = mean output tokens x remaining stages."""
    decode_ms_per_token: dict[str, Positive] = field(default_factory=dict)
    max_batch_size: dict[str, PositiveInt] = field(default_factory=dict)
    picker: PickerName = "lmetric"
    """The engine picker that chooses among the chosen model's engines
    (``router.policies.pickers``; docs/policies.md)."""


QUALITY_HINT = {
    "semantic_router": "train the semantic router (python -m router.train semantic_router) "
                       "and set router.predictors.semantic_router",
    "knn": "build the KNN estimator (python -m router.train knn) and set "
           "router.predictors.knn (chimera.quality = \"knn\")"}


@dataclass(frozen=True)
class ChimeraPrediction:
    q: Mapping[str, float] | None
    """None where no semantic routing is needed: a later stage of a sticky program, a
    first attempt behind a trusted check."""
    remaining: Mapping[str, float]


def model_latency(inflight_tokens: float, decode_ms_per_token: float,
                  max_batch_size: int) -> float:
    """L[m] = P_m x decode_ms_per_token[m] / max_batch_size[m]."""
    return inflight_tokens * decode_ms_per_token / max_batch_size


def fastest(q: Mapping[str, float], lat: Mapping[str, float]) -> str:
    """m_fast = argmin_m L[m] over the models of ``lat`` (ties: higher q, then the name)."""
    return min(lat, key=lambda m: (lat[m], -q[m], m))


def select_model(q: Mapping[str, float], lat: Mapping[str, float], tau: float,
                 delta_s: float) -> str:
    """Algorithm 1 over the models of ``lat``: the confident model within the slack."""
    m_fast = fastest(q, lat)
    q_star, l_fast = q[m_fast], lat[m_fast]
    for m in sorted(lat, key=lambda m: (-q[m], lat[m], m)):
        if lat[m] <= (1 + tau) * l_fast and q[m] >= q_star + delta_s:
            return m
    return m_fast


def predicted_gain(q: Mapping[str, float], lat: Mapping[str, float]) -> float | None:
    """max over m != m_fast of q[m] - q[m_fast]: the margin Algorithm 1 compares with
    delta_s (the slack aside); None with one model."""
    m_fast = fastest(q, lat)
    return max((q[m] - q[m_fast] for m in lat if m != m_fast), default=None)


class ShareMargin:
    """``target_share``'s delta_s: the (1 - share) quantile of the last ``window``
    predicted gains, so that about ``share`` of the calls' gains reach it whatever the
    gains' distribution. The quantile's positions are p(n + 1) (Weibull's, as
    ``np.quantile(method="weibull")``, which the tests check it against): for
    exchangeable gains the next one exceeds the k-th smallest of n with probability
    (n + 1 - k) / (n + 1), so the share holds from a few calls on, where the usual
    p(n - 1) positions send about 1 / (n + 1) too many (measured in the tuning runs,
    docs/research/predictors.md). ``initial`` while the position lies outside the n gains seen
    (the first calls: n < (1 - share) / share, or share / (1 - share) for a share above a
    half)."""

    def __init__(self, share: float, window: int, initial: float) -> None:
        self.share, self.initial = share, initial
        self.gains: deque[float] = deque(maxlen=window)
        """The window in arrival order (which one leaves next)."""
        self.ranked: list[float] = []
        """The same gains sorted: a decision reads the quantile without sorting (on the
        router's hot path: ``np.quantile`` over the window cost about 160 us a call)."""

    def next(self, gain: float) -> float:
        """delta_s for a call of predicted gain ``gain`` (from the gains before it); a
        non-finite gain is not recorded (it would disorder the ranking)."""
        ranked, n = self.ranked, len(self.ranked)
        h = (1 - self.share) * (n + 1)  # 1-based Weibull position
        if 1 <= h <= n:
            i, frac = int(h) - 1, h - int(h)
            margin = ranked[i] if i + 1 == n else ranked[i] + frac * (ranked[i + 1] - ranked[i])
        else:
            margin = self.initial
        if math.isfinite(gain):
            if n == self.gains.maxlen:
                del ranked[bisect.bisect_left(ranked, self.gains[0])]
            self.gains.append(gain)
            bisect.insort(ranked, gain)
        return margin


class Chimera(PickerPolicy[ChimeraSettings]):
    name = "chimera"
    program_affinity = True
    predictors_used = ("semantic_router", "length")
    Settings = ChimeraSettings
    inputs = frozenset({"model_inflight_tokens", "program_model"})
    default_picker = "lmetric"

    @classmethod
    def predictors_for(cls, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The semantic router's place taken by the KNN where ``quality = "knn"``."""
        return ("knn" if settings.get("quality") == "knn" else "semantic_router", "length")

    def __init__(self, settings: ChimeraSettings, cluster: Any, predictors: Any,
                 build: BuildPolicy) -> None:
        super().__init__(settings, cluster, predictors, build)
        s, models = settings, cluster.models
        q_source = (predictors.semantic_router if s.quality == "semantic_router" else
                    None if predictors.knn is None else KnnConfidence(predictors.knn))
        self.q_source, self.sources["confidence"] = resolve(
            self.name, "per-model confidences q[m]", q_source,
            getattr(q_source, "models", None), models, QUALITY_HINT[s.quality],
            s.static_prior, {"confidence": s.confidence},
            lambda: StaticConfidence(s.confidence))
        self.len_source, self.sources["remaining_tokens"] = resolve(
            self.name, "predicted remaining workflow tokens", predictors.length,
            getattr(predictors.length, "models", None), models,
            "train the length predictor (python -m router.train length) and set "
            "router.predictors.length", s.static_prior,
            {"mean_output_tokens": s.mean_output_tokens},
            lambda: StaticRemainingTokens(s.mean_output_tokens))
        profiles = predictors.profiles
        unprofiled = [m for m in models if m not in profiles]
        if not unprofiled:
            self.decode_ms = {m: profiles[m].decode_ms_per_token for m in models}
            self.max_batch = {m: profiles[m].max_batch_size for m in models}
            self.sources["profile"] = "predictor"
        else:
            _, self.sources["profile"] = resolve(
                self.name, f"decode profiles (decode_ms_per_token, max_batch_size) of "
                f"{', '.join(unprofiled)}", None, None, models,
                "profile the engines (python -m kernels_bench profile) and set "
                "router.predictors.profiles", s.static_prior,
                {"decode_ms_per_token": s.decode_ms_per_token,
                 "max_batch_size": s.max_batch_size}, lambda: None)
            self.decode_ms, self.max_batch = dict(s.decode_ms_per_token), dict(s.max_batch_size)
        self.margin = (None if s.target_share is None else
                       ShareMargin(s.target_share, s.share_window, s.delta_s))
        self.concurrent = isinstance(self.q_source, Served) and \
            isinstance(self.len_source, Served)
        """Both predictors behind the worker pool: their batches are awaited together (an
        in-process predictor answers without suspending, so a ``gather``'s tasks would
        only add event-loop turns)."""

    def _sticky_later(self, req: RoutingRequest) -> bool:
        """A later stage of a program whose model its first stage chose."""
        w = req.workflow
        return self.settings.sticky and w.program_id is not None and (w.stage_index or 0) > 0

    def _check_trusted(self, req: RoutingRequest) -> bool:
        """A first attempt routed by latency alone (``on_check``)."""
        w = req.workflow
        return self.settings.on_check != "q" and bool(w.checked) and not w.tried_models

    def _needs_q(self, req: RoutingRequest) -> bool:
        return not (self._sticky_later(req) or self._check_trusted(req))

    async def predict(self, reqs: Sequence[RoutingRequest]) -> list[ChimeraPrediction]:
        needs = [self._needs_q(r) for r in reqs]
        first = [r for r, need in zip(reqs, needs) if need]
        if self.concurrent:
            got, lens = await asyncio.gather(
                self.q_source.confidence(first) if first else _none(),
                self.len_source.remaining_tokens(reqs))
        else:
            got = await self.q_source.confidence(first) if first else []
            lens = await self.len_source.remaining_tokens(reqs)
        qs = iter(got)
        return [ChimeraPrediction(next(qs) if need else None, n)
                for need, n in zip(needs, lens)]

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: ChimeraPrediction) -> Decision:
        s = self.settings
        models = models_of(cands)
        lat = {m: model_latency(view.model_inflight_tokens(m), self.decode_ms[m],
                                self.max_batch[m]) for m in models}
        assigned = view.program_model(req.workflow.program_id) if s.sticky else None
        if assigned is not None and assigned in lat:
            model, sticky = assigned, True
        else:
            model, sticky = self._select(req, pred, lat), False
        pick = self.picker.pick(req, of_model(cands, model), view)
        remaining = pred.remaining[model]
        return decision(req, pick.engine, self.name, priority=priority_for(remaining),
                        predicted_remaining_tokens=remaining,
                        info={"q": None if pred.q is None else pred.q[model],
                              "L_ms": lat[model], "sticky": sticky, **pick.info})

    def _select(self, req: RoutingRequest, pred: ChimeraPrediction,
                lat: Mapping[str, float]) -> str:
        """Algorithm 1, over the untried models of a retried call (``escalate``), with
        equal confidences where the agent's check stands behind its first attempt
        (``on_check = "m_fast"``) or the program's model is gone; ``first_done`` where
        ``on_check`` says so."""
        s, tried = self.settings, req.workflow.tried_models
        if s.on_check == "first_done" and self._check_trusted(req):
            return first_done(lat, pred.remaining, self.decode_ms)
        if s.latency == "finish":
            lat = finish_times(lat, pred.remaining, self.decode_ms)
        if s.escalate and tried:
            lat = {m: v for m, v in lat.items() if m not in tried} or lat
        if pred.q is None:
            return select_model(dict.fromkeys(lat, 0.0), lat, s.tau, s.delta_s)
        delta_s = s.delta_s
        if self.margin is not None and not tried:  # a first call
            gain = predicted_gain(pred.q, lat)
            delta_s = delta_s if gain is None else self.margin.next(gain)
        return select_model(pred.q, lat, s.tau, delta_s)


def finish_times(lat: Mapping[str, float], remaining: Mapping[str, float],
                 decode_ms_per_token: Mapping[str, float]) -> dict[str, float]:
    """The program's expected finish time on each model of ``lat``: L[m] + P-hat[m] x
    decode_ms_per_token[m] (its congestion, then its own tokens one decode step each)."""
    return {m: lat[m] + remaining[m] * decode_ms_per_token[m] for m in lat}


def first_done(lat: Mapping[str, float], remaining: Mapping[str, float],
               decode_ms_per_token: Mapping[str, float]) -> str:
    """The model of ``lat`` expected to end the program first (``finish_times``); ties to
    the name."""
    done = finish_times(lat, remaining, decode_ms_per_token)
    return min(done, key=lambda m: (done[m], m))


async def _none() -> list[Mapping[str, float]]:
    return []
