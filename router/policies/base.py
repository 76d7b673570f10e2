"""Routing requests and decisions, the policy interface, and settings validation.

A policy receives a request, its candidate engines (up, serving the requested model,
with room for the request) and a read-only ``StateView``, and returns a ``Decision``.
It never writes router state: the state package records every decision. A policy may
keep private decision history (a round-robin pointer, a seeded RNG, LMETRIC's hotspot
counters), which only its own decisions update.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import (Any, Callable, ClassVar, Generic, Iterable, Mapping, Protocol, Sequence,
                    TypeVar, get_args, get_origin, get_type_hints)

from engine_ext.contract import PRIORITY_MAX
from router.predictors.base import PredictorSet
from router.state.view import EngineView, StateView
from router.vinelm.objective import Objective


class NoEngineAvailable(Exception):
    """No engine that could serve the request is up (HTTP 503)."""


@dataclass(frozen=True)
class WorkflowMeta:
    """Workflow metadata of one LLM call (all optional)."""

    program_id: str | None = None
    workflow: str | None = None
    stage: str | None = None
    stage_index: int | None = None
    num_stages: int | None = None
    final: bool | None = None
    budget: float | None = None
    """Cost budget left for this request (RouteBalance's admission and clamp)."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Per-request policy weights (RouteBalance: ``quality``, ``cost``, ``latency``)."""
    attempt: int = 1
    tried_models: Sequence[str] = ()
    """Models already tried for this request (LAAR's retry penalty); stored as a tuple."""
    objective: Objective | None = None
    """VineLM's request objective (``router.vinelm.objective``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tried_models", tuple(self.tried_models))
        object.__setattr__(self, "weights", dict(self.weights))

    @property
    def is_final(self) -> bool:
        """The last stage of its program: ``final`` if given, else from the stage index."""
        if self.final is not None:
            return self.final
        return (self.stage_index is not None and self.num_stages is not None
                and self.stage_index >= self.num_stages - 1)

    @property
    def remaining_stages(self) -> int | None:
        """Stages left including this one, when the stage count is known."""
        if self.num_stages is None:
            return None
        return max(1, self.num_stages - (self.stage_index or 0))


@dataclass(frozen=True)
class RoutingRequest:
    request_id: str
    requested_model: str | None
    """Served model name, or ``None`` for ``auto``."""
    prompt_text: str = ""
    system_text: str = ""
    user_text: str = ""
    prompt_token_ids: Sequence[int] | None = None
    """The prompt as the engine tokenizes it (chat template applied), if known."""
    num_prompt_tokens: int = 0
    max_tokens: int | None = None
    workflow: WorkflowMeta = field(default_factory=WorkflowMeta)
    arrival_time: float = 0.0


@dataclass(frozen=True)
class Decision:
    request_id: str
    instance: str
    model: str
    """Served model name."""
    url: str
    policy: str
    priority: int | None = None
    """Engine priority per ``engine_ext.contract`` (``None``: send none)."""
    predicted_remaining_tokens: float | None = None
    max_tokens: int | None = None
    """``max_tokens`` to send instead of the client's (budget clamp), ``None``: keep."""
    program_id: str | None = None
    final: bool = False
    cached_tokens: int = 0
    """Prompt tokens the chosen engine is predicted to serve from its prefix cache (set
    by the router core when it records the decision)."""
    info: Mapping[str, Any] = field(default_factory=dict)


def decision(req: RoutingRequest, engine: EngineView, policy: str, **kw: Any) -> Decision:
    return Decision(request_id=req.request_id, instance=engine.name, model=engine.model,
                    url=engine.url, policy=policy, program_id=req.workflow.program_id,
                    final=req.workflow.is_final, **kw)


def priority_for(predicted_tokens: float | None) -> int | None:
    """The contract's priority for a prediction: round, clamp to 1..PRIORITY_MAX."""
    if predicted_tokens is None or not math.isfinite(predicted_tokens):
        return None
    return min(PRIORITY_MAX, max(1, round(predicted_tokens)))


def models_of(cands: Sequence[EngineView]) -> list[str]:
    """Distinct models of the candidates, in name order."""
    return sorted({e.model for e in cands})


@dataclass(frozen=True)
class ClusterInfo:
    """What a policy may know about the cluster when it is built."""

    engine_models: Mapping[str, str]
    """Engine name -> served model name."""

    @property
    def models(self) -> list[str]:
        return sorted(set(self.engine_models.values()))


S = TypeVar("S")


class BatchWindow(Protocol):
    max_batch: int

    def arrival(self, now: float) -> None:
        """A request arrived at ``now``."""

    def window_s(self) -> float:
        """How long a batch that starts now may wait for more requests."""


class Policy(ABC, Generic[S]):
    """Base of every policy. ``Settings`` is its settings dataclass."""

    name: ClassVar[str]
    Settings: ClassVar[type]
    window: BatchWindow | None = None
    """Set by batched policies: they implement ``decide_batch`` and a collector feeds
    them batches closed by this window."""

    def __init__(self, settings: S, cluster: ClusterInfo, predictors: PredictorSet,
                 all_settings: Mapping[str, Mapping[str, Any]]) -> None:
        """``all_settings``: every ``[router.policies.<name>]`` table (for sub-policies).
        Raises ValueError when a predictor or profile the policy needs is missing."""
        self.settings = settings
        self.sources: dict[str, str] = {}
        """Input -> where it comes from (``predictor`` or ``static_prior``)."""

    async def predict(self, reqs: Sequence[RoutingRequest]) -> list[Any]:
        """Batched predictions for ``reqs`` (one object per request)."""
        return [None] * len(reqs)

    @abstractmethod
    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        """Choose among ``cands`` (non-empty, sorted by name)."""

    def decide_batch(self, reqs: Sequence[RoutingRequest],
                     cands: Sequence[Sequence[EngineView]], view: StateView,
                     preds: Sequence[Any]) -> Sequence[Decision | ValueError]:
        """Decide a batch at once; a request that cannot be placed gets its error."""
        raise NotImplementedError(f"policy '{self.name}' does not batch")


# ---- settings validation ----


class SettingError(ValueError):
    """A bad value of one settings key (the registry adds the table's path)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def check(key: str, ok: bool, message: str) -> None:
    if not ok:
        raise SettingError(key, message)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin = get_origin(tp)
    if tp is Any:  # a nested table the settings class validates itself
        return value
    if tp is str:
        if not isinstance(value, str):
            raise SettingError(key, f"must be a string, got {value!r}")
        return value
    if origin is dict:
        _, vtp = get_args(tp)
        if not isinstance(value, Mapping):
            raise SettingError(key, f"must be a table of model -> {_type_name(vtp)}, "
                                    f"got {type(value).__name__}")
        return {str(k): _coerce(f"{key}.{k}", v, vtp) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise SettingError(key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingError(key, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise SettingError(key, f"must be finite, got {value!r}")
        return float(value)
    raise TypeError(f"unsupported settings type {tp!r} for {key}")


def parse_settings(cls: type[S], policy: str, table: Mapping[str, Any]) -> S:
    """Build ``cls`` from a TOML table; ValueError naming the key on any bad entry."""
    prefix = f"router.policies.{policy}"
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    try:
        for key, value in table.items():
            if key not in known:
                raise SettingError(key, "unknown key; known keys: " + (", ".join(known)
                                                                       or "none"))
            kwargs[key] = _coerce(key, value, hints[key])
        return cls(**kwargs)
    except SettingError as exc:
        raise ValueError(f"{prefix}.{exc.key}: {exc.message}") from None


T = TypeVar("T")


def resolve(policy: str, what: str, predictor: Any, covers: Iterable[str] | None,
            needed: Sequence[str], hint: str, static_prior: bool,
            tables: Mapping[str, Mapping[str, Any]], make_static: Callable[[], T],
            table_keys: Sequence[str] | None = None) -> tuple[Any, str]:
    """The predictor for ``what`` if given, else the static prior if the settings select
    it, else a start-up error saying what to train or profile.

    Returns ``(source object, "predictor" | "static_prior")``. A given predictor must know
    every ``needed`` model (or engine); static tables must cover every ``table_keys``
    entry (default: ``needed``).
    """
    if predictor is not None:
        missing = sorted(set(needed) - set(covers or ()))
        if missing:
            raise ValueError(f"policy '{policy}' needs {what} for {', '.join(missing)}, "
                             f"which the given predictor does not know: {hint}")
        return predictor, "predictor"
    if static_prior:
        for key, table in tables.items():
            missing = [m for m in (table_keys or needed) if m not in table]
            if missing:
                raise ValueError(f"router.policies.{policy}.{key}: static_prior = true but "
                                 f"no value for {', '.join(missing)}")
        return make_static(), "static_prior"
    raise ValueError(f"policy '{policy}' needs {what}: {hint}; or set "
                     f"router.policies.{policy}.static_prior = true with the "
                     f"{' and '.join(tables)} table(s) to use constants instead")
