"""Routing requests and decisions: the types every layer of the router shares.

The HTTP front builds a ``RoutingRequest``; a policy answers it with a ``Decision``;
dispatch records it. The request's ``Workflow`` is the one admission decoded
(``router.request``). This module sits at the bottom of ``router/``, above
``router.request`` only: it imports nothing of the policies, the state or the predictors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from router.request import Workflow


class NoEngineAvailable(Exception):
    """No engine that could serve the request is up (HTTP 503)."""


class Overloaded(Exception):
    """The router sheds this request: a queue it needs is full (HTTP 503, retry later)."""


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
    workflow: Workflow = field(default_factory=Workflow)
    arrival_time: float = 0.0
    engine: str | None = None
    """The one engine that may serve it (the one holding the response it continues)."""
    program_source: str = "none"
    """How admission found ``workflow.program_id`` (``router.admission.programs``)."""
    conversation: tuple[bytes, ...] = ()
    """Digests of the conversation's prefixes (``router.admission.programs``): the k-th
    covers its first k + 1 messages or input items."""
    owner: bytes = b""
    """The caller's tenant (its API key's digest): whose the responses it makes are."""
    retain: bool = False
    """Ask the engine to keep the program's prefix after this call: an agent's call (it
    offers tools) of a program found from what its trusted caller sent
    (``router.proxy.Proxy._retention``)."""


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
