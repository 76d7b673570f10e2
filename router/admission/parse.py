"""``parse_request``: a request body decoded once and typed, or a 400 that names the field.

The body is decoded once from JSON (msgspec: no NaN/Infinity, no number beyond a double,
bounded nesting, UTF-8 only, no lone surrogate: every string is valid Unicode, so it can
be echoed and forwarded), then typed as ``ChatBody``, ``CompletionBody`` or an agents' API
body (``router.admission.agents``) and the workflow block as ``Workflow``
(``router.admission.convert``). Nothing here raises
anything but ``RequestError`` on any input.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import msgspec
from msgspec import UNSET

from router.admission import agents
from router.admission.bodies import FIELDS, ChatBody, CompletionBody, Priority, Prompt
from router.admission.convert import bad, convert, dotted, type_name
from router.admission.workflow import RANKING_FIELDS, parse_workflow
from router.request import AUTO_MODEL, Kind, ParsedRequest, RequestError

_CONSTANT = re.compile(rb"(?<![\w\"])(?:NaN|-?Infinity)(?![\w\"])")
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_PART = re.compile(r"^messages\[\d+\]\.content\[\d+\]$")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object."""
    try:
        obj = msgspec.json.decode(raw)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as exc:
        if isinstance(exc, RecursionError):
            detail = "nesting too deep"
        elif isinstance(exc, UnicodeDecodeError):
            detail = "the body is not UTF-8"
        elif _LONE_SURROGATE.search(raw):
            detail = "a string holds a lone UTF-16 surrogate"
        elif (constant := _CONSTANT.search(raw)) is not None:
            detail = f"{constant.group().decode()} is not a JSON value"
        else:
            detail = str(exc)[:200]
        raise bad(f"request body is not valid JSON: {detail}", None, "invalid_json") from None
    if not isinstance(obj, dict):
        raise bad(f"request body must be a JSON object, got {type_name(obj)}", None,
                  "invalid_json")
    return obj


def _chat(body: dict[str, Any]) -> tuple[ChatBody, list[dict[str, Any]]]:
    """The typed chat body and its messages with text-part lists joined into strings (as
    vLLM does)."""
    try:
        typed = convert(body, ChatBody, dotted, FIELDS)
    except RequestError as exc:
        if exc.param is not None and _PART.match(exc.param) and exc.code == "invalid_type":
            raise _not_text(exc.param, type_name(_part(body, exc.param))) from None
        raise
    if typed.chat_template is not None:
        raise bad("'chat_template' is not accepted: the router renders the model's own "
                  "template", "chat_template", "unsupported_field")
    if typed.messages is None:
        raise bad(FIELDS.required["messages"], "messages", "missing_field")
    messages: list[dict[str, Any]] = body["messages"]
    for i, msg in enumerate(typed.messages):
        param = f"messages[{i}]"
        if msg.content is None or msg.content is UNSET:
            if msg.role != "assistant":
                raise bad(f"'{param}.content' is required for role '{msg.role}'",
                          f"{param}.content", "missing_field")
        elif isinstance(msg.content, list):
            texts = []
            for j, part in enumerate(msg.content):
                p = f"{param}.content[{j}]"
                if part.type != "text":
                    raise _not_text(p, part.type)
                if part.text is UNSET:
                    raise bad(f"'{p}.text' must be a string, got null", f"{p}.text",
                              "invalid_type")
                texts.append(part.text)
            messages = messages if messages is not body["messages"] else list(messages)
            messages[i] = {**messages[i], "content": "\n".join(texts)}
    return typed, messages


def _not_text(param: str, kind: Any) -> RequestError:
    return bad(f"'{param}' must be a text part {{\"type\": \"text\", \"text\": ...}}; "
               f"'{kind}' parts are not supported", param)


def _part(body: dict[str, Any], param: str) -> Any:
    i, j = (int(n) for n in re.findall(r"\d+", param))
    return body["messages"][i]["content"][j]


def _prompt(value: Any) -> str | list[int]:
    """A completion's one prompt: text or token ids (a list of one unwrapped)."""
    if value is None:
        raise bad(FIELDS.required["prompt"], "prompt", "missing_field")
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        if len(value) != 1:
            raise bad(f"'prompt' holds {len(value)} prompts; the router routes one prompt "
                      "per request, send one request per prompt", "prompt")
        value = value[0]
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            raise bad("'prompt' must be a string or an array of token ids", "prompt",
                      "invalid_type")
    return convert(value, Prompt,  # type: ignore[arg-type]
                   lambda p: dotted(["prompt", *p]), FIELDS)


def parse_request(
    kind: Kind,
    raw: bytes,
    headers: Mapping[str, str],
    *,
    allow_client_priority: bool = False,
    trusted: bool = True,
) -> ParsedRequest:
    """Validate a generation request of any API (``Kind``). From an untrusted caller the
    ``RANKING_FIELDS`` and client priorities are validated, then dropped
    (``ParsedRequest.ignored``)."""
    body = parse_json(raw)
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    typed: ChatBody | CompletionBody | agents.ResponsesBody | agents.MessagesBody
    param, include_usage, previous = "max_tokens", False, None
    if kind == "chat":
        typed, messages = _chat(body)
        max_tokens = typed.max_tokens
        if typed.max_completion_tokens is not None:
            param, max_tokens = "max_completion_tokens", typed.max_completion_tokens
    elif kind == "completion":
        typed = convert(body, CompletionBody, dotted, FIELDS)
        max_tokens, prompt = typed.max_tokens, _prompt(typed.prompt)
    elif kind == "responses":
        typed, messages, tools = agents.responses(body)
        param, max_tokens = "max_output_tokens", typed.max_output_tokens
        previous = typed.previous_response_id
    else:
        typed, messages, tools = agents.messages(body)
        max_tokens = typed.max_tokens
    if isinstance(typed, (ChatBody, CompletionBody)):
        include_usage = bool(typed.stream_options is not None
                             and typed.stream_options.include_usage)
    priority = None
    if allow_client_priority:
        given = typed.priority if typed.priority is not None else _hinted_priority(body)
        if given is not None:
            priority = convert(given, Priority, lambda p: "priority", FIELDS)
    per_model: dict[str, dict[str, int]] = {}
    if typed.per_model is not None:
        if typed.per_model.max_tokens is not UNSET:
            per_model["max_tokens"] = typed.per_model.max_tokens
        if typed.per_model.priority is not UNSET:
            per_model["priority"] = typed.per_model.priority
    workflow = parse_workflow(typed.workflow, headers)
    ignored: tuple[str, ...] = ()
    if not trusted:
        ignored = tuple(f for f in RANKING_FIELDS if getattr(workflow, f) is not None)
        workflow = msgspec.structs.replace(workflow, **dict.fromkeys(ignored, None))
        ignored += tuple(f for f, given in (("priority", priority is not None),
                                            ("per_model.priority", "priority" in per_model))
                         if given and allow_client_priority)
        allow_client_priority, priority = False, None
    return ParsedRequest(
        kind=kind,
        body=body,
        model=None if typed.model in (None, AUTO_MODEL) else typed.model,
        stream=bool(typed.stream),
        include_usage=include_usage,
        max_tokens=max_tokens,
        max_tokens_param=param,
        messages=messages,
        prompt=prompt,
        client_priority=priority,
        per_model=per_model,
        model_max_tokens=per_model.get("max_tokens", {}),
        model_priority=per_model.get("priority", {}) if allow_client_priority else {},
        workflow=workflow,
        body_bytes=len(raw),
        ignored=ignored,
        tools=tools,
        previous_response_id=previous,
    )


def _hinted_priority(body: dict[str, Any]) -> Any:
    """Dynamo's ``nvext.agent_hints.priority`` (lower is served first, as vLLM's)."""
    nvext = body.get("nvext")
    hints = nvext.get("agent_hints") if isinstance(nvext, dict) else None
    return hints.get("priority") if isinstance(hints, dict) else None


def context_error(parsed: ParsedRequest, model: str, max_model_len: int,
                  num_prompt_tokens: int) -> RequestError | None:
    """The error for a request whose prompt plus ``max_tokens`` exceeds ``max_model_len``."""
    if num_prompt_tokens >= max_model_len:
        return RequestError(
            400, f"model '{model}' has a context of {max_model_len} tokens, but the prompt "
            f"alone is {num_prompt_tokens} tokens; shorten the prompt",
            param=prompt_param(parsed.kind), code="context_length_exceeded")
    max_tokens, param = parsed.max_tokens, parsed.max_tokens_param
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        return RequestError(
            400, f"model '{model}' has a context of {max_model_len} tokens, but {param}="
            f"{max_tokens} plus {num_prompt_tokens} prompt tokens is "
            f"{num_prompt_tokens + max_tokens}; lower {param} to at most "
            f"{max_model_len - num_prompt_tokens}", param=param, code="context_length_exceeded")
    return None


def prompt_param(kind: Kind) -> str:
    """The body field that holds the prompt."""
    return {"completion": "prompt", "responses": "input"}.get(kind, "messages")
