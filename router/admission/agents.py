"""The agents' APIs: OpenAI's Responses (``/v1/responses``) and Anthropic's Messages
(``/v1/messages``) bodies, typed as far as the router reads them, and their conversation
in chat-completions form for the chat template (the prompt's tokens: its length, its KV
prefix on each engine).

The conversion follows what vLLM does with these APIs before rendering them (instructions
and ``system`` as a system message, ``function_call`` / ``tool_use`` as an assistant's
tool calls, ``function_call_output`` / ``tool_result`` as tool messages, text parts
joined with newlines). Reasoning items and thinking blocks are left out; image, audio and
file parts are refused, as in chat. Every other field passes to the engine, which
validates it against its own schema.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from router.admission.bodies import NonEmpty, PerModel, TokenCount
from router.admission.convert import Fields, bad, convert, dotted
from router.request import MAX_LABEL_CHARS

Id = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
"""A bounded client id (a response id, a cache key, a user)."""
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content parts the router reads as text (chat's, Responses' input and output)."""
SKIPPED_PARTS = frozenset({"reasoning", "thinking", "redacted_thinking", "refusal"})
"""Items and blocks that are no prompt text for the router."""

_encode = msgspec.json.encode


class Part(Struct):
    """A content part or block: text is read; tool blocks (Messages) become tool calls
    and tool messages."""

    type: NonEmpty
    text: str | UnsetType = UNSET
    id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    input: Any = None
    tool_use_id: str | UnsetType = UNSET
    content: Any = None


class InputItem(Struct):
    """A Responses ``input`` item: a message (``role`` and ``content``), a function call
    or its output; other types pass to the engine."""

    type: str | None = None
    role: str | UnsetType = UNSET
    content: str | list[Part] | UnsetType = UNSET
    call_id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    output: Any = None


class Metadata(Struct):
    user_id: Id | None = None


class AgentBody(Struct):
    """What both agents' APIs read; ``null`` is the same as absent."""

    model: NonEmpty | None = None
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = None
    priority: Any = None
    per_model: PerModel | None = None
    workflow: dict[str, Any] | None = None


class ResponsesBody(AgentBody):
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    previous_response_id: Id | None = None
    prompt_cache_key: Id | None = None
    user: Id | None = None


class AnthropicMessage(Struct):
    role: NonEmpty
    content: str | list[Part]


class MessagesBody(AgentBody):
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1)] | None = None
    system: str | list[Part] | None = None
    max_tokens: TokenCount | None = None
    metadata: Metadata | None = None


FIELDS = Fields(expected={"messages": "a non-empty array",
                          "content": "a string or an array of content blocks",
                          "input": "a string or an array of input items",
                          "system": "a string or an array of text blocks",
                          "max_tokens:object": "an object of model -> integer",
                          "priority:object": "an object of model -> integer"},
                required={"messages": "'messages' is required: a non-empty array of {role, "
                                      "content} objects",
                          "type": "'type' is required"},
                tables={"max_tokens": TokenCount})


def _text(parts: str | list[Part] | UnsetType | None, param: str) -> str:
    """The text of a content: a string, or its text parts joined with newlines."""
    if parts is UNSET or parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if part.type in TEXT_PARTS:
            if not isinstance(part.text, str):
                raise bad(f"'{param}[{j}].text' must be a string", f"{param}[{j}].text",
                          "invalid_type")
            texts.append(part.text)
        elif part.type not in SKIPPED_PARTS and part.type not in ("tool_use", "tool_result"):
            raise bad(f"'{param}[{j}]' must be a text part; '{part.type[:64]}' parts are not "
                      "supported", f"{param}[{j}]")
    return "\n".join(texts)


def _output(value: Any) -> str:
    """A tool's output as text (a string, or text parts; anything else as JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "\n".join(str(p.get("text", "")) for p in value)
    return "" if value is None else _encode(value).decode()


def responses(body: dict[str, Any]) -> tuple[ResponsesBody, list[dict[str, Any]],
                                             list[dict[str, Any]] | None]:
    """The typed Responses body, its conversation as chat messages and its function tools
    as chat tools (400 naming the field)."""
    typed = convert(body, ResponsesBody, dotted, FIELDS)
    if typed.input is None:
        raise bad("'input' is required: a string or an array of input items", "input",
                  "missing_field")
    messages: list[dict[str, Any]] = []
    if typed.instructions:
        messages.append({"role": "system", "content": typed.instructions})
    if isinstance(typed.input, str):
        messages.append({"role": "user", "content": typed.input})
    else:
        for i, item in enumerate(typed.input):
            kind = item.type or "message"
            if kind == "message" or (item.type is None and item.role is not UNSET):
                if not isinstance(item.role, str):
                    raise bad(f"'input[{i}].role' is required", f"input[{i}].role",
                              "missing_field")
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role,
                                 "content": _text(item.content, f"input[{i}].content")})
            elif kind == "function_call":
                messages.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": item.call_id or "", "type": "function", "function": {
                        "name": item.name or "", "arguments": item.arguments or ""}}]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.call_id or "",
                                 "content": _output(item.output)})
    tools = [{"type": "function", "function": {k: t[k] for k in
                                                ("name", "description", "parameters") if k in t}}
             for t in typed.tools or () if t.get("type") == "function"]
    return typed, messages, tools or None


def messages(body: dict[str, Any]) -> tuple[MessagesBody, list[dict[str, Any]],
                                            list[dict[str, Any]] | None]:
    """The typed Messages body, its conversation as chat messages and its tools as chat
    tools (400 naming the field)."""
    typed = convert(body, MessagesBody, dotted, FIELDS)
    if typed.messages is None:
        raise bad(FIELDS.required["messages"], "messages", "missing_field")
    if typed.max_tokens is None:
        raise bad("'max_tokens' is required: the most tokens to generate", "max_tokens",
                  "missing_field")
    out: list[dict[str, Any]] = []
    if typed.system:
        out.append({"role": "system", "content": _text(typed.system, "system")})
    for i, msg in enumerate(typed.messages):
        param = f"messages[{i}].content"
        text = _text(msg.content, param)
        blocks = msg.content if isinstance(msg.content, list) else []
        calls = [{"id": b.id or "", "type": "function", "function": {
            "name": b.name or "", "arguments": _encode(b.input or {}).decode()}}
            for b in blocks if b.type == "tool_use"]
        for b in blocks:
            if b.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id or "",
                            "content": _output(b.content)})
        if text or calls or not blocks:
            out.append({"role": msg.role, "content": text,
                        **({"tool_calls": calls} if calls else {})})
    tools = [{"type": "function", "function": {
        "name": t.get("name", ""), "description": t.get("description", ""),
        "parameters": t.get("input_schema", {})}} for t in typed.tools or ()
        if isinstance(t.get("name"), str)]
    return typed, out, tools or None
