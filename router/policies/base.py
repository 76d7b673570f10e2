"""The policy interface and the helpers policies share.

A policy receives a request, its candidate engines (up, serving the requested model,
with room for the request) and a read-only ``StateView``, and returns a ``Decision``.
It never writes router state: dispatch (``router.dispatch``) records every decision. A
policy may keep private decision history (a round-robin pointer, a seeded RNG, LMETRIC's
hotspot counters), which only its own decisions update. A ``PickerPolicy`` leaves the
engine to an engine picker (``router.policies.pickers``), its own instance.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import (Any, Callable, ClassVar, Generic, Iterable, Mapping, Protocol,
                    Sequence, TypeVar)

from router.policies.pickers.base import Picker
from router.predictors.base import PredictorSet
from router.state.view import Candidates, EngineView, StateView
from router.types import BatchWindow, ClusterInfo, Decision, RoutingRequest
from scheduler_patches.contract import PRIORITY_MAX


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
    if isinstance(cands, Candidates):
        return cands.models()
    return sorted({e.model for e in cands})


def of_model(cands: Sequence[EngineView], model: str) -> Sequence[EngineView]:
    """The candidates serving ``model``, in name order (router candidates stay unviewed
    until read)."""
    if isinstance(cands, Candidates):
        return cands.of_model(model)
    return [e for e in cands if e.model == model]


S = TypeVar("S")


class BuildPolicy(Protocol):
    """What a policy builds its parts with, from the same settings tables, cluster and
    predictors (``registry.build_policy`` makes one)."""

    def __call__(self, policy: str) -> Policy[Any]:
        """Another policy by name, from its own settings table."""

    def picker(self, name: str) -> Picker:
        """A new engine picker by name (``PICKERS``); ValueError if it cannot start."""


class Policy(ABC, Generic[S]):
    """Base of every policy. ``Settings`` is its settings class (``router.settings``)."""

    name: ClassVar[str]
    Settings: ClassVar[type]
    predictors_used: ClassVar[tuple[str, ...]] = ()
    """The ``[router.predictors]`` artifacts the policy routes on when given (else its
    static priors, when its settings select them); ``predictors_for`` narrows it by the
    settings."""
    uses_prompt: bool = True
    """Whether the policy reads the request's prompt (``prompt_text``, ``system_text``,
    ``user_text``, ``prompt_token_ids``, ``num_prompt_tokens``), directly or through its
    predictors, the ``StateView`` (prefix matches) or a policy it builds; a built
    ``PickerPolicy`` adds its picker's. False lets the router skip tokenizing when a bound
    shows the prompt fits (``router.admission``); set it only where
    tests/unit/test_policies_prompt.py shows no such read."""
    inputs: ClassVar[frozenset[str]] = frozenset()
    """The engine state the policy reads (``EngineView`` fields and properties,
    ``StateView`` methods: ``router.policies.inputs.Input``, which says where each comes
    from on a stock vLLM engine), directly or through its helpers; its engine picker and a
    policy its settings name (VineLM's fallback) read their own
    (``router.policies.inputs.policy_inputs``). tests/unit/test_policy_inputs.py checks it
    against the source."""
    default_picker: ClassVar[str | None] = None
    """A ``PickerPolicy``'s engine picker when its settings name none."""
    program_affinity: ClassVar[bool] = False
    """Whether a program's calls go back to its last engine, load permitting
    (``router.policies.affinity``, ``[router] program_affinity``): the policies that
    route programs; not the baselines, which route each call as it comes."""
    window: BatchWindow | None = None
    """Set by batched policies: they implement ``decide_batch`` and a collector feeds
    them batches closed by this window."""

    @classmethod
    def predictors_for(cls, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The predictors it routes on under ``settings`` (its raw config table)."""
        return cls.predictors_used

    def __init__(self, settings: S, cluster: ClusterInfo, predictors: PredictorSet,
                 build: BuildPolicy) -> None:
        """``build``: another policy or an engine picker by name, for a part of this one's
        job (a fallback). Raises ValueError when a predictor or profile the policy needs is
        missing."""
        self.settings = settings
        self.sources: dict[str, str] = {}
        """Input -> where it comes from (``predictor`` or ``static_prior``)."""

    async def predict(self, reqs: Sequence[RoutingRequest]) -> list[Any]:
        """Batched predictions for ``reqs`` (one object per request)."""
        return [None] * len(reqs)

    def add_engine(self, name: str, model: str, like: str) -> None:
        """A replica of ``model`` joined while the router runs; ``like`` is one it had
        (same model): per-engine knowledge (a latency head) may be taken from it. Policies
        that only read the candidates they are given need nothing."""

    def remove_engine(self, name: str) -> None:
        """A replica was removed for good (after ``add_engine`` or at a scale-down)."""

    @abstractmethod
    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        """Choose among ``cands`` (non-empty, sorted by name)."""

    def decide_batch(self, reqs: Sequence[RoutingRequest],
                     cands: Sequence[Sequence[EngineView]], view: StateView,
                     preds: Sequence[Any]) -> Sequence[Decision | ValueError]:
        """Decide a batch at once; a request that cannot be placed gets its error."""
        raise NotImplementedError(f"policy '{self.name}' does not batch")


class PickerPolicy(Policy[S]):
    """A policy whose engine is chosen by its engine picker: over every candidate
    (``lmetric``, ``vllm``), or among the candidates of the model it chose (its settings'
    ``picker``, a ``PickerName`` defaulting to ``default_picker``)."""

    default_picker: ClassVar[str]

    def __init__(self, settings: S, cluster: ClusterInfo, predictors: PredictorSet,
                 build: BuildPolicy) -> None:
        super().__init__(settings, cluster, predictors, build)
        self.picker = build.picker(getattr(settings, "picker", self.default_picker))
        self.uses_prompt = type(self).uses_prompt or self.picker.uses_prompt

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        """The picker's engine among every candidate (a policy that chooses the model
        first overrides this)."""
        pick = self.picker.pick(req, cands, view)
        return decision(req, pick.engine, self.name, info=pick.info)


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
