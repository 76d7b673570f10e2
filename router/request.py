"""The typed request the router serves (``ParsedRequest``) and its ``Workflow``, their
bounds, and ``RequestError``: a 4xx or 5xx rendered as an OpenAI error object.
``router.admission`` makes a ``ParsedRequest`` from a client's body and headers."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta, Struct

from router.vinelm.objective import MAX_NUMBER, Objective
from scheduler_patches.contract import MAX_EXPECTED_RETURN_S

Kind = Literal["chat", "completion", "responses", "messages"]
"""The generation APIs: OpenAI's chat completions, completions and Responses, and
Anthropic's Messages."""
PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions",
                          "responses": "/v1/responses", "messages": "/v1/messages"}
"""Each API's path, on the router and on the engines alike."""
AUTO_MODEL = "auto"
"""``model`` value (or absent ``model``) that lets the policy choose the model."""
MAX_TOKENS = 1 << 20
"""Largest ``max_tokens`` (and ``per_model.max_tokens``) taken when no engine sets
``max_model_len`` (then the context bounds it further)."""
MAX_N = 128
"""Largest ``n`` (completions per request)."""
MAX_STAGES = 10_000
"""Largest ``workflow.num_stages``, ``stage_index`` and ``attempt``."""
MAX_TOKEN_ID = 2**31 - 1
MAX_LABEL_CHARS = 1024
"""Longest ``workflow.program_id``, ``workflow`` and ``stage`` (the program table keeps
ids, router workers send them to each other)."""


_ids = itertools.count(1)
_ID_PREFIX = os.urandom(8).hex()


def request_id() -> str:
    """A new request id, unique across router processes and restarts: a random prefix
    per process and a counter (``uuid4`` reads the OS's random source per call)."""
    return f"{_ID_PREFIX}{next(_ids):x}"


NEW_PROGRAM = "new:"
"""Prefix of the id of a program admission started for a call that named none
(``router.admission.programs``)."""
ProgramSource = Literal["workflow", "agentic_context", "session", "prompt_cache_key",
                        "metadata_user_id", "previous_response", "conversation", "new",
                        "none"]
"""How admission found a call's program, in its order (``router.admission.programs``)."""
PROGRAM_SOURCES: tuple[ProgramSource, ...] = get_args(ProgramSource)


Label = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
Weight = Annotated[float, Meta(ge=0.0, le=MAX_NUMBER)]


class Workflow(Struct, frozen=True, forbid_unknown_fields=True):
    """The workflow metadata of one LLM call, all optional: decoded once at admission
    (``router.admission.workflow``: the bounds are in the types) and carried to the
    policy, the program table and the engine's retention hint."""

    program_id: Label | None = None
    workflow: Label | None = None
    stage: Label | None = None
    stage_index: Annotated[int, Meta(ge=0, le=MAX_STAGES - 1)] | None = None
    num_stages: Annotated[int, Meta(ge=1, le=MAX_STAGES)] | None = None
    final: bool | None = None
    budget: Weight | None = None
    """Cost budget left for this request (RouteBalance's admission and clamp)."""
    weights: dict[str, Weight] = msgspec.field(default_factory=dict)
    """Per-request policy weights (RouteBalance: ``quality``, ``cost``, ``latency``)."""
    attempt: Annotated[int, Meta(ge=1, le=MAX_STAGES)] = 1
    tried_models: tuple[Annotated[str, Meta(min_length=1)], ...] = ()
    """Models already tried for this request (LAAR's retry penalty); stored as a tuple."""
    checked: bool | None = None
    """The agent checks the program's final answer (its tests, a verifier) and tries again
    when the check fails; ``False``: it has no check (``cascade`` then starts at the top);
    None: not said."""
    objective: Objective | None = None
    """VineLM's request objective (checked by ``router.vinelm.objective.parse_objective``)."""
    expected_return_s: Annotated[float, Meta(ge=0.0, le=MAX_EXPECTED_RETURN_S)] | None = None
    """Seconds from this call's end to the program's next call (the engine keeps the
    program's KV cache about that long; ``scheduler_patches.contract``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.tried_models, tuple):
            msgspec.structs.force_setattr(self, "tried_models", tuple(self.tried_models))

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


class RequestError(Exception):
    """A client or upstream error, rendered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_
        self.retry_after_s = retry_after_s
        """Sent as the ``retry-after`` header: the client may try again that much later."""

    def body(self, kind: Kind | None = None) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``; for Anthropic's Messages
        API (``kind`` ``messages``), its shape: ``{"type": "error", "error": {"type",
        "message"}}``."""
        if kind == "messages":
            return {"type": "error", "error": {"type": self.type, "message": self.message}}
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def overloaded(why: str) -> RequestError:
    """The 503 of a request the router sheds; the client should retry a second later."""
    return RequestError(503, f"the router is overloaded: {why}; retry later",
                        type_="service_unavailable", code="overloaded", retry_after_s=1)


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request; ``body`` is the client's JSON object, untouched."""

    kind: Kind
    body: dict[str, Any]
    model: str | None
    """Requested served model name, ``None`` for ``auto``."""
    stream: bool
    include_usage: bool
    """The client asked for ``stream_options.include_usage``."""
    max_tokens: int | None
    max_tokens_param: str
    """``max_completion_tokens`` if the client set it (chat), else ``max_tokens``."""
    messages: list[dict[str, Any]] | None = None
    """Chat messages with text-part lists joined into strings (as vLLM does)."""
    prompt: str | list[int] | None = None
    """Completion prompt: text or token ids."""
    client_priority: int | None = None
    """The client's ``priority`` when the config allows it, else ``None``."""
    per_model: dict[str, dict[str, int]] = field(default_factory=dict)
    """The validated ``per_model`` tables as given (the front checks their model names)."""
    model_max_tokens: dict[str, int] = field(default_factory=dict)
    """``per_model.max_tokens``: served model -> ``max_tokens`` if the router picks it."""
    model_priority: dict[str, int] = field(default_factory=dict)
    """``per_model.priority`` when the config allows client priorities, else empty."""
    workflow: Workflow = field(default_factory=Workflow)
    """The workflow block, from the body and the headers (``router.admission.workflow``);
    from an untrusted caller without its ranking fields."""
    body_bytes: int = 0
    """Size of the raw body: bounds the work of rendering and tokenizing it."""
    ignored: tuple[str, ...] = ()
    """Ranking fields an untrusted caller gave, dropped
    (``router.admission.workflow.RANKING_FIELDS``, priorities)."""
    tools: list[dict[str, Any]] | None = None
    """The tools in chat-completions form (the chat template renders them)."""
    previous_response_id: str | None = None
    """Responses API: the stored response this call continues."""
