"""Routing requests and decisions: the types every layer of the router shares.

The HTTP front builds a ``RoutingRequest``; a policy answers it with a ``Decision``;
dispatch records it. This module sits at the bottom of ``router/``: it imports nothing
of the policies, the state or the predictors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from router.vinelm.objective import Objective


class NoEngineAvailable(Exception):
    """No engine that could serve the request is up (HTTP 503)."""


class Overloaded(Exception):
    """The router sheds this request: a queue it needs is full (HTTP 503, retry later)."""


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
    checked: bool | None = None
    """Whether the agent checks the program's final answer and retries when it fails
    (``cascade``: a program without a check starts on the last rung); None: not said."""
    objective: Objective | None = None
    """VineLM's request objective (``router.vinelm.objective``)."""
    expected_return_s: float | None = None
    """Seconds from this call's end to the program's next call (KV retention)."""

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
    """``len(prompt_token_ids)``; 0, with no text or ids, when the router did not tokenize
    (a policy that reads no prompt, ``Policy.uses_prompt``, and a prompt that fits)."""
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
    """Engine priority per ``scheduler_patches.contract`` (``None``: send none)."""
    predicted_remaining_tokens: float | None = None
    max_tokens: int | None = None
    """``max_tokens`` to send instead of the client's (budget clamp), ``None``: keep."""
    program_id: str | None = None
    final: bool = False
    cached_tokens: int = 0
    """Prompt tokens the chosen engine is predicted to serve from its prefix cache (set
    by the router core when it records the decision)."""
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterInfo:
    """What a policy may know about the cluster when it is built."""

    engine_models: Mapping[str, str]
    """Engine name -> served model name."""

    @property
    def models(self) -> list[str]:
        return sorted(set(self.engine_models.values()))


class BatchWindow(Protocol):
    max_batch: int

    def arrival(self, now: float) -> None:
        """A request arrived at ``now``."""

    def window_s(self) -> float:
        """How long a batch that starts now may wait for more requests."""
