"""Parsing and validation of OpenAI request bodies and hetserve workflow metadata.

Everything a client sends is checked here, before routing: a bad body raises
``RequestError`` (an OpenAI-style error object with a 4xx status and a message that
names the field and what is wrong). Nothing in this module raises anything else on any
input. The rest of the body (sampling parameters, tools, ...) passes to the engine
unchanged, which validates it against its own schema.

Workflow metadata comes from a ``workflow`` object in the body (what OpenAI clients send
through ``extra_body``) or from ``X-Hetserve-*`` headers; a field given in both places
takes the body's value. See ``docs/router.md`` for the field table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import msgspec

from router.vinelm.objective import (MAX_NUMBER, Objective, ObjectiveError,
                                     objective_from_header, parse_objective)
from scheduler_patches.contract import PRIORITY_MAX, PRIORITY_MIN

Kind = Literal["chat", "completion"]
AUTO_MODEL = "auto"
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
TEMPLATE_KWARGS = {"enable_thinking": bool, "thinking": bool, "reasoning_effort": str}
"""The ``chat_template_kwargs`` a client may set, with their types: switches the shipped
templates read. A client's own template (``chat_template``, top level or inside the kwargs)
is refused: it would run client code in the router and the engine."""
"""``model`` value (or absent ``model``) that lets the policy choose the model."""


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

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None, code: str = "invalid_value") -> RequestError:
    return RequestError(400, message, param=param, code=code)


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
    workflow: dict[str, Any] = field(default_factory=dict)
    """Validated workflow fields that were given (keys of ``WORKFLOW_FIELDS``)."""
    body_bytes: int = 0
    """Size of the raw body: bounds the work of rendering and tokenizing it."""
    ignored: tuple[str, ...] = ()
    """Ranking fields an untrusted caller gave, dropped (``RANKING_FIELDS``, priorities)."""


# ---------------------------------------------------------------- JSON


_CONSTANT = re.compile(rb"(?<![\w\"])(?:NaN|-?Infinity)(?![\w\"])")
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (msgspec: no NaN/Infinity, no number beyond a double,
    bounded nesting, UTF-8 only, no lone surrogate: every string is valid Unicode, so it
    can be echoed and forwarded)."""
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
        raise _bad(f"request body is not valid JSON: {detail}", None, "invalid_json") from None
    if not isinstance(obj, dict):
        raise _bad(f"request body must be a JSON object, got {_type(obj)}", None, "invalid_json")
    return obj


def _type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- typed field checks


def _int(value: Any, param: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{param}' must be an integer, got {_type(value)}", param, "invalid_type")
    if not minimum <= value <= maximum:
        bound = f">= {minimum}" if value < minimum else f"<= {maximum}"
        raise _bad(f"'{param}' must be {bound}, got {_shown(value)}", param)
    return value


def _number(value: Any, param: str, minimum: float, maximum: float = MAX_NUMBER) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{param}' must be a number, got {_type(value)}", param, "invalid_type")
    if not minimum <= value <= maximum:  # also false for NaN; no float() of a huge int
        bound = f">= {minimum}" if value < minimum else f"<= {maximum:g}"
        raise _bad(f"'{param}' must be a finite number {bound}, got {_shown(value)}", param)
    return float(value)


def _shown(value: int | float) -> str:
    """A number for an error message (a huge integer by its digit count)."""
    text = str(value)
    return text if len(text) <= 40 else f"an integer of {len(text)} digits"


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"'{param}' must be a string, got {_type(value)}", param, "invalid_type")
    if not value:
        raise _bad(f"'{param}' must not be empty", param)
    return value


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"'{param}' must be a boolean, got {_type(value)}", param, "invalid_type")
    return value


def _label(value: Any, param: str) -> str:
    value = _str(value, param)
    if len(value) > MAX_LABEL_CHARS:
        raise _bad(f"'{param}' must be at most {MAX_LABEL_CHARS} characters, got "
                   f"{len(value)}", param)
    return value


def _str_list(value: Any, param: str) -> list[str]:
    if not isinstance(value, list):
        raise _bad(f"'{param}' must be an array of strings, got {_type(value)}", param,
                   "invalid_type")
    return [_str(v, f"{param}[{i}]") for i, v in enumerate(value)]


def _weights(value: Any, param: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise _bad(f"'{param}' must be an object of name -> number, got {_type(value)}",
                   param, "invalid_type")
    return {k: _number(v, f"{param}.{k}", 0.0) for k, v in value.items()}


def _objective(value: Any, param: str) -> Objective:
    try:
        return parse_objective(value, param)
    except ObjectiveError as exc:
        raise _bad(exc.message, exc.param) from None


# ---------------------------------------------------------------- workflow metadata

WORKFLOW_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "program_id": _label,
    "workflow": _label,
    "stage": _label,
    "stage_index": lambda v, p: _int(v, p, 0, MAX_STAGES - 1),
    "num_stages": lambda v, p: _int(v, p, 1, MAX_STAGES),
    "final": _bool,
    "budget": lambda v, p: _number(v, p, 0.0),
    "weights": _weights,
    "attempt": lambda v, p: _int(v, p, 1, MAX_STAGES),
    "tried_models": _str_list,
    "objective": _objective,
}
"""Workflow field -> validator (JSON value, param name) -> value."""

RANKING_FIELDS = ("workflow", "stage", "stage_index", "num_stages", "final")
"""Workflow fields that rank a call (its predicted remaining tokens, hence its engine
priority: "final stage" buys a high one): used only from trusted callers
(``router.auth``); an untrusted caller's are dropped and the router predicts alone."""

HEADER_PREFIX = "x-hetserve-"


def _header_value(name: str, raw: str) -> Any:
    """Convert a header string to the JSON value its workflow field expects."""
    raw = raw.strip()
    if name in ("stage_index", "num_stages", "attempt"):
        try:
            return int(raw)
        except ValueError:
            return raw  # the validator reports the type error
    if name == "budget":
        try:
            return float(raw)
        except ValueError:
            return raw
    if name == "final":
        return {"true": True, "1": True, "yes": True,
                "false": False, "0": False, "no": False}.get(raw.lower(), raw)
    if name == "tried_models":
        return [m.strip() for m in raw.split(",") if m.strip()]
    if name == "objective":
        return objective_from_header(raw)
    if name == "weights":
        weights: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, val = item.partition("=")
            try:
                weights[key.strip()] = float(val) if sep else val
            except ValueError:
                weights[key.strip()] = val
        return weights
    return raw


def header_name(field_name: str) -> str:
    """``program_id`` -> ``X-Hetserve-Program-Id``."""
    return "X-Hetserve-" + "-".join(p.capitalize() for p in field_name.split("_"))


def parse_workflow(body_value: Any, headers: Mapping[str, str]) -> dict[str, Any]:
    """Validated workflow fields from ``X-Hetserve-*`` headers, overridden by the body."""
    merged: dict[str, tuple[Any, str]] = {}
    given = {k.lower(): v for k, v in headers.items() if k.lower().startswith(HEADER_PREFIX)}
    for name in WORKFLOW_FIELDS:
        raw = given.pop(header_name(name).lower(), None)
        if raw is not None:
            merged[name] = (_header_value(name, raw), header_name(name))
    unknown = sorted(given)
    if unknown:
        raise _bad(f"unknown header '{unknown[0]}'; workflow headers are "
                   + ", ".join(header_name(n) for n in WORKFLOW_FIELDS), unknown[0])
    if body_value is not None:
        if not isinstance(body_value, dict):
            raise _bad(f"'workflow' must be an object, got {_type(body_value)}", "workflow",
                       "invalid_type")
        for key, value in body_value.items():
            if key not in WORKFLOW_FIELDS:
                raise _bad(f"unknown field 'workflow.{key}'; expected one of "
                           + ", ".join(WORKFLOW_FIELDS), f"workflow.{key}")
            merged[key] = (value, f"workflow.{key}")
    out = {name: WORKFLOW_FIELDS[name](value, param) for name, (value, param) in merged.items()}
    index, stages = out.get("stage_index"), out.get("num_stages")
    if index is not None and stages is not None and index >= stages:
        raise _bad(f"'workflow.stage_index' ({index}) must be < 'workflow.num_stages' "
                   f"({stages})", "workflow.stage_index")
    return out


# ---------------------------------------------------------------- per-model values

PER_MODEL_FIELDS = ("max_tokens", "priority")
"""Keys of the body's ``per_model`` object: values the router applies according to the
model it picks (trace replay forces each model's own output length; oracle STJF)."""


def parse_per_model(value: Any) -> dict[str, dict[str, int]]:
    """``per_model`` = ``{"max_tokens": {model: int >= 1}, "priority": {model: int}}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"'per_model' must be an object, got {_type(value)}", "per_model",
                   "invalid_type")
    out: dict[str, dict[str, int]] = {}
    for key, table in value.items():
        param = f"per_model.{key}"
        if key not in PER_MODEL_FIELDS:
            raise _bad(f"unknown field '{param}'; expected one of "
                       + ", ".join(PER_MODEL_FIELDS), param)
        if not isinstance(table, dict):
            raise _bad(f"'{param}' must be an object of model -> integer, got "
                       f"{_type(table)}", param, "invalid_type")
        low, high = (1, MAX_TOKENS) if key == "max_tokens" else (PRIORITY_MIN, PRIORITY_MAX)
        out[key] = {_str(m, param): _int(v, f"{param}.{m}", low, high)
                    for m, v in table.items()}
    return out


# ---------------------------------------------------------------- bodies


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise _bad("'messages' is required: a non-empty array of {role, content} objects",
                   "messages", "missing_field")
    if not isinstance(value, list) or not value:
        raise _bad(f"'messages' must be a non-empty array, got "
                   f"{'an empty array' if value == [] else _type(value)}", "messages",
                   "invalid_type" if not isinstance(value, list) else "invalid_value")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def _message(msg: Any, param: str) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise _bad(f"'{param}' must be an object, got {_type(msg)}", param, "invalid_type")
    role = _str(msg.get("role"), f"{param}.role") if "role" in msg else None
    if role is None:
        raise _bad(f"'{param}.role' is required", f"{param}.role", "missing_field")
    content = msg.get("content")
    if content is None:
        if role != "assistant":
            raise _bad(f"'{param}.content' is required for role '{role}'",
                       f"{param}.content", "missing_field")
        return dict(msg)
    if isinstance(content, str):
        return dict(msg)
    if not isinstance(content, list):
        raise _bad(f"'{param}.content' must be a string or an array of content parts, got "
                   f"{_type(content)}", f"{param}.content", "invalid_type")
    texts = []
    for j, part in enumerate(content):
        p = f"{param}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else _type(part)
            raise _bad(f"'{p}' must be a text part {{\"type\": \"text\", \"text\": ...}}; "
                       f"'{kind}' parts are not supported", p)
        texts.append(_str_or_empty(part.get("text"), f"{p}.text"))
    return {**msg, "content": "\n".join(texts)}


def _str_or_empty(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"'{param}' must be a string, got {_type(value)}", param, "invalid_type")
    return value


def _token_ids(value: list[Any], param: str) -> list[int]:
    return [_int(t, f"{param}[{i}]", 0, MAX_TOKEN_ID) for i, t in enumerate(value)]


def _prompt(value: Any) -> str | list[int]:
    if value is None:
        raise _bad("'prompt' is required: a string or an array of token ids", "prompt",
                   "missing_field")
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        if len(value) != 1:
            raise _bad(f"'prompt' holds {len(value)} prompts; the router routes one prompt "
                       "per request, send one request per prompt", "prompt")
        value = value[0]
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            raise _bad("'prompt' must be a string or an array of token ids", "prompt",
                       "invalid_type")
    if isinstance(value, str):
        if not value:
            raise _bad("'prompt' must not be empty", "prompt")
        return value
    if isinstance(value, list):
        if not value:
            raise _bad("'prompt' must not be empty", "prompt")
        return _token_ids(value, "prompt")
    raise _bad(f"'prompt' must be a string or an array of token ids, got {_type(value)}",
               "prompt", "invalid_type")


def _template_kwargs(body: dict[str, Any]) -> None:
    """No client template; only the ``TEMPLATE_KWARGS`` switches, with their types."""
    if body.get("chat_template") is not None:
        raise _bad("'chat_template' is not accepted: the router renders the model's own "
                   "template", "chat_template", "unsupported_field")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise _bad(f"'chat_template_kwargs' must be an object, got {_type(kwargs)}",
                   "chat_template_kwargs", "invalid_type")
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{key}"
        expected = TEMPLATE_KWARGS.get(key)
        if expected is None:
            raise _bad(f"'{param[:100]}' is not accepted; allowed: "
                       + ", ".join(TEMPLATE_KWARGS), param[:100], "unsupported_field")
        if not isinstance(value, expected) or (expected is str and len(value) > 64):
            raise _bad(f"'{param}' must be a {'boolean' if expected is bool else 'short string'}"
                       f", got {_type(value)}", param, "invalid_type")


def _optional(body: dict[str, Any], key: str, check: Callable[[Any, str], Any]) -> Any:
    value = body.get(key)
    return None if value is None else check(value, key)


def parse_request(
    kind: Kind,
    raw: bytes,
    headers: Mapping[str, str],
    *,
    allow_client_priority: bool = False,
    trusted: bool = True,
) -> ParsedRequest:
    """Validate a ``/v1/chat/completions`` or ``/v1/completions`` request. From an
    untrusted caller the ``RANKING_FIELDS`` and client priorities are validated, then
    dropped (``ParsedRequest.ignored``)."""
    body = parse_json(raw)
    model = _optional(body, "model", _str)
    stream = bool(_optional(body, "stream", _bool))
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad(f"'stream_options' must be an object, got {_type(options)}",
                   "stream_options", "invalid_type")
    include_usage = bool(_optional(options or {}, "include_usage", _bool))
    _optional(body, "n", lambda v, p: _int(v, p, 1, MAX_N))
    param = "max_tokens"
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        param = "max_completion_tokens"
    max_tokens = _optional(body, param, lambda v, p: _int(v, p, 1, MAX_TOKENS))
    if kind == "chat":
        _template_kwargs(body)
    priority = None
    if allow_client_priority:
        priority = _optional(body, "priority",
                             lambda v, p: _int(v, p, PRIORITY_MIN, PRIORITY_MAX))
    per_model = parse_per_model(body.get("per_model"))
    workflow = parse_workflow(body.get("workflow"), headers)
    ignored: tuple[str, ...] = ()
    if not trusted:
        ignored = tuple(f for f in RANKING_FIELDS if f in workflow)
        ignored += tuple(f for f, given in (("priority", priority is not None),
                                            ("per_model.priority", "priority" in per_model))
                         if given and allow_client_priority)
        workflow = {k: v for k, v in workflow.items() if k not in RANKING_FIELDS}
        allow_client_priority, priority = False, None
    return ParsedRequest(
        kind=kind,
        body=body,
        model=None if model in (None, AUTO_MODEL) else model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        max_tokens_param=param,
        messages=_messages(body.get("messages")) if kind == "chat" else None,
        prompt=_prompt(body.get("prompt")) if kind == "completion" else None,
        client_priority=priority,
        per_model=per_model,
        model_max_tokens=per_model.get("max_tokens", {}),
        model_priority=per_model.get("priority", {}) if allow_client_priority else {},
        workflow=workflow,
        body_bytes=len(raw),
        ignored=ignored,
    )


def context_error(parsed: ParsedRequest, model: str, max_model_len: int,
                  num_prompt_tokens: int) -> RequestError | None:
    """The error for a request whose prompt plus ``max_tokens`` exceeds ``max_model_len``."""
    if num_prompt_tokens >= max_model_len:
        return RequestError(
            400, f"model '{model}' has a context of {max_model_len} tokens, but the prompt "
            f"alone is {num_prompt_tokens} tokens; shorten the prompt",
            param="messages" if parsed.kind == "chat" else "prompt",
            code="context_length_exceeded")
    max_tokens, param = parsed.max_tokens, parsed.max_tokens_param
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        return RequestError(
            400, f"model '{model}' has a context of {max_model_len} tokens, but {param}="
            f"{max_tokens} plus {num_prompt_tokens} prompt tokens is "
            f"{num_prompt_tokens + max_tokens}; lower {param} to at most "
            f"{max_model_len - num_prompt_tokens}", param=param, code="context_length_exceeded")
    return None


def upstream_body(
    parsed: ParsedRequest, model: str, priority: int | None, max_tokens: int | None
) -> bytes:
    """The body sent to the engine: the client's body with ``model``, ``priority`` and
    ``max_tokens`` set by the router, ``workflow``, ``priority`` and ``per_model`` removed,
    and usage requested on streams (the router strips the usage chunk again if the client
    did not ask for it)."""
    body = {k: v for k, v in parsed.body.items()
            if k not in ("workflow", "priority", "per_model")}
    body["model"] = model
    if priority is not None:
        body["priority"] = priority
    if max_tokens is not None:
        body[parsed.max_tokens_param] = max_tokens
    if parsed.stream:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return msgspec.json.encode(body)
