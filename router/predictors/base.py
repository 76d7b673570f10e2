"""What the policies need from predictors and profiles, and the explicit static priors.

The learned predictors (issue 5) implement these protocols; a batched service may stand
in front of them. Every predictor answers for a batch of requests at once and names the
models (or engines) it knows, so a mismatch with the cluster fails at start-up.

Static priors are used only when a policy's settings say ``static_prior = true`` and
give the tables; they are constants, never a disguised default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class QualityLength:
    """RouteBalance's per-model estimate for one request (KNN, section 4.2)."""

    quality: float
    """Predicted quality score in [0, 1]."""
    output_tokens: float
    """Predicted output length of this request."""


class TpotQuery(NamedTuple):
    """Engine state a latency head conditions on (RouteBalance section 4.2). A named tuple:
    cheap to build (one per candidate engine per decision)."""

    engine: str
    batch_size: int
    """Running requests (plus the router's not yet reported ones, dead-reckoned)."""
    pending_decode_tokens: int
    context_tokens: int
    """Prompt tokens of the request being placed."""
    kv_usage: float
    """The engine's KV cache usage fraction at its last snapshot."""


@dataclass(frozen=True)
class ModelProfile:
    """Per-model decode profile (``python -m kernels_bench profile``)."""

    decode_ms_per_token: float
    """Decode step time per output token at full batch."""
    max_batch_size: int
    mean_output_tokens: float | None = None
    """Mean output length of the model's responses, where profiled on a trace."""


@runtime_checkable
class SemanticRouter(Protocol):
    """Chimera section 3.3: independent sigmoid confidence q[m] per model."""

    models: frozenset[str]

    async def confidence(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        ...


@runtime_checkable
class LengthPredictor(Protocol):
    """Chimera section 3.4: median total remaining output tokens of the request's workflow
    from its current stage on, if served by each model."""

    models: frozenset[str]

    async def remaining_tokens(self, reqs: Sequence[RoutingRequest]
                               ) -> list[Mapping[str, float]]:
        ...


@runtime_checkable
class QualityLengthEstimator(Protocol):
    """RouteBalance section 4.2: every model's quality and output length in one lookup."""

    models: frozenset[str]

    async def estimate(self, reqs: Sequence[RoutingRequest]
                       ) -> list[Mapping[str, QualityLength]]:
        ...


@runtime_checkable
class TpotPredictor(Protocol):
    """RouteBalance section 4.2: per-engine time per output token (ms) from engine state.

    Synchronous: called inside the greedy assignment with dead-reckoned states."""

    engines: frozenset[str]

    def tpot_ms(self, queries: Sequence[TpotQuery]) -> list[float]:
        ...


@runtime_checkable
class CapabilityModel(Protocol):
    """LAAR section 5.2: Q(m, x), the probability that model m answers x correctly."""

    models: frozenset[str]

    async def capability(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        ...


@dataclass
class PredictorSet:
    """Everything learned or profiled that the router was given (any part may be absent)."""

    semantic_router: SemanticRouter | None = None
    length: LengthPredictor | None = None
    knn: QualityLengthEstimator | None = None
    tpot: TpotPredictor | None = None
    capability: CapabilityModel | None = None
    profiles: Mapping[str, ModelProfile] = field(default_factory=dict)
    """Served model name -> decode profile."""
    call_ms: Mapping[str, float] = field(default_factory=dict)
    """Per predictor the service could run: its cost per call timed at start-up, which
    decided where it runs (``loader.placement``; empty without a service)."""


# ---- static priors (explicitly selected by ``static_prior = true``) ----


class StaticConfidence:
    """q[m] = a constant per model."""

    def __init__(self, table: Mapping[str, float]) -> None:
        self.table = dict(table)
        self.models = frozenset(self.table)

    async def confidence(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return [self.table] * len(reqs)


class KnnConfidence:
    """q[m] read from RouteBalance's KNN estimator (section 4.2): its quality estimate per
    model, for a policy that takes confidences (Chimera's ``quality = "knn"``)."""

    def __init__(self, knn: QualityLengthEstimator) -> None:
        self.knn, self.models = knn, frozenset(knn.models)

    async def confidence(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return [{m: e.quality for m, e in row.items()} for row in await self.knn.estimate(reqs)]


class StaticCapability:
    """Q(m, x) = a constant per model."""

    def __init__(self, table: Mapping[str, float]) -> None:
        self.table = dict(table)
        self.models = frozenset(self.table)

    async def capability(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return [self.table] * len(reqs)


class StaticRemainingTokens:
    """Remaining workflow tokens = mean output tokens of the model x remaining stages
    (the current one included; 1 when the request gives no stage count)."""

    def __init__(self, mean_output_tokens: Mapping[str, float]) -> None:
        self.mean = dict(mean_output_tokens)
        self.models = frozenset(self.mean)

    async def remaining_tokens(self, reqs: Sequence[RoutingRequest]
                               ) -> list[Mapping[str, float]]:
        out: list[Mapping[str, float]] = []
        for req in reqs:
            stages = req.workflow.remaining_stages or 1
            out.append({m: v * stages for m, v in self.mean.items()})
        return out


class StaticQualityLength:
    """Quality and output length = constants per model."""

    def __init__(self, quality: Mapping[str, float],
                 mean_output_tokens: Mapping[str, float]) -> None:
        self.table = {m: QualityLength(quality[m], mean_output_tokens[m]) for m in quality}
        self.models = frozenset(self.table)

    async def estimate(self, reqs: Sequence[RoutingRequest]
                       ) -> list[Mapping[str, QualityLength]]:
        return [self.table] * len(reqs)


class StaticTpot:
    """TPOT of an engine = its model's ``decode_ms_per_token``, whatever its state."""

    def __init__(self, engine_models: Mapping[str, str],
                 decode_ms_per_token: Mapping[str, float]) -> None:
        self.ms = {e: decode_ms_per_token[m] for e, m in engine_models.items()}
        self.engines = frozenset(self.ms)

    def tpot_ms(self, queries: Sequence[TpotQuery]) -> list[float]:
        return [self.ms[q.engine] for q in queries]
