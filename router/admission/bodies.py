"""The fields of ``/v1/chat/completions`` and ``/v1/completions`` bodies the router reads,
as msgspec structs with their bounds. Every other field (sampling parameters, tools, ...)
passes to the engine unchanged, which validates it against its own schema."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import UNSET, Meta, Struct, UnsetType

from router.admission.convert import Fields, bad
from router.request import MAX_N, MAX_TOKEN_ID, MAX_TOKENS
from scheduler_patches.contract import PRIORITY_MAX, PRIORITY_MIN

NonEmpty = Annotated[str, Meta(min_length=1)]
TokenCount = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
Priority = Annotated[int, Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
Prompt = NonEmpty | Annotated[list[TokenId], Meta(min_length=1)]
"""A completion prompt: text or token ids."""


class TextPart(Struct):
    """A part of a message's content; only text parts (``type`` "text") are routed."""

    type: Any = None
    text: str | UnsetType = UNSET


class Message(Struct):
    role: NonEmpty
    content: str | list[TextPart] | None | UnsetType = UNSET
    """Absent or null only for the assistant."""


class StreamOptions(Struct):
    include_usage: bool | None = None


class TemplateKwargs(Struct, forbid_unknown_fields=True):
    """The ``chat_template_kwargs`` a client may set: switches the shipped templates read.
    A client's own template (``chat_template``, top level or inside the kwargs) is
    refused: it would run client code in the router and the engine."""

    enable_thinking: bool | UnsetType = UNSET
    thinking: bool | UnsetType = UNSET
    reasoning_effort: Annotated[str, Meta(max_length=64)] | UnsetType = UNSET


class PerModel(Struct, forbid_unknown_fields=True):
    """Values the router applies according to the model it picks (trace replay forces each
    model's own output length; oracle STJF): served model -> value."""

    max_tokens: dict[str, TokenCount] | UnsetType = UNSET
    priority: dict[str, Priority] | UnsetType = UNSET
    """Applied only when the config allows client priorities."""


PER_MODEL_FIELDS: tuple[str, ...] = PerModel.__struct_fields__
TEMPLATE_KWARGS: tuple[str, ...] = TemplateKwargs.__struct_fields__


class Body(Struct):
    """What both endpoints read; ``null`` is the same as absent."""

    model: NonEmpty | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] | None = None
    max_tokens: TokenCount | None = None
    priority: Any = None
    """Checked against ``Priority`` when the config allows client priorities."""
    per_model: PerModel | None = None
    workflow: dict[str, Any] | None = None
    """Merged with the headers, then decoded as ``router.request.Workflow``."""


class ChatBody(Body):
    messages: Annotated[list[Message], Meta(min_length=1)] | None = None
    max_completion_tokens: TokenCount | None = None
    chat_template: Any = None
    """Refused: the router renders the model's own template."""
    chat_template_kwargs: TemplateKwargs | None = None


class CompletionBody(Body):
    prompt: Any = None
    """Text, token ids, or a list of one of them; typed as ``Prompt`` once unwrapped."""


def _template_kwarg(p: str) -> Any:
    return bad(f"'{p[:100]}' is not accepted; allowed: " + ", ".join(TEMPLATE_KWARGS),
               p[:100], "unsupported_field")


FIELDS = Fields(
    expected={"messages": "a non-empty array",
              "content": "a string or an array of content parts",
              "prompt": "a string or an array of token ids",
              "max_tokens:object": "an object of model -> integer",
              "priority:object": "an object of model -> integer",
              "reasoning_effort": "a short string"},
    required={"messages": "'messages' is required: a non-empty array of {role, content} "
                          "objects",
              "prompt": "'prompt' is required: a string or an array of token ids"},
    unknown={"per_model": lambda p: bad(f"unknown field '{p}'; expected one of "
                                        + ", ".join(PER_MODEL_FIELDS), p),
             "chat_template_kwargs": _template_kwarg},
    tables={"max_tokens": TokenCount, "priority": Priority})
"""What the messages say about the bodies' fields (``router.admission.convert``)."""
