"""ASGI middleware of the engine server: rejects bad priorities and retention hints
before vLLM sees them.

vLLM accepts any integer ``priority`` and silently ignores an unparsable
``X-Vllm-Priority`` header. The engine contract (``scheduler_patches.contract``) accepts
integers in ``[PRIORITY_MIN, PRIORITY_MAX]`` only, and a retention hint in ``vllm_xargs``
only when well formed; anything else gets an OpenAI-style 400 here and never reaches the
engine.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from scheduler_patches.contract import (PRIORITY_HEADER, PRIORITY_MAX, PRIORITY_MIN,
                                        XARGS_FIELD, retention_hint)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_GUARDED_SUFFIXES = ("/completions", "/chat/completions")


def priority_error(value: Any, source: str) -> str | None:
    """Why ``value`` (from ``source``) is not an acceptable priority, or None if it is."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{source} must be an integer, got {value!r}"
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        return f"{source} must be in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {value}"
    return None


def _header_priority(scope: Scope) -> tuple[bool, Any]:
    name = PRIORITY_HEADER.lower().encode()
    for key, raw in scope.get("headers", []):
        if key.lower() == name:
            text = raw.decode("latin-1").strip()
            try:
                return True, int(text)
            except ValueError:
                return True, text
    return False, None


class PriorityGuard:
    """Validates ``priority`` (body) and ``X-Vllm-Priority`` (header) on completion calls."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope.get("type") != "http" or scope.get("method") != "POST"
                or not scope.get("path", "").endswith(_GUARDED_SUFFIXES)):
            await self.app(scope, receive, send)
            return
        has_header, header_value = _header_priority(scope)
        if has_header and (err := priority_error(header_value, f"header {PRIORITY_HEADER}")):
            await _reject(send, err, "priority")
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        rejected = body_error(body)
        if rejected is not None:
            await _reject(send, *rejected)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def body_error(body: bytes) -> tuple[str, str] | None:
    """(message, param) of a body's bad priority or retention hint, None if neither."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # not JSON: vLLM answers that itself
    if not isinstance(payload, dict):
        return None
    if "priority" in payload and (err := priority_error(payload["priority"], "priority")):
        return err, "priority"
    xargs = payload.get(XARGS_FIELD)
    if isinstance(xargs, dict):  # anything else: vLLM's own 400
        try:
            retention_hint(xargs)
        except ValueError as exc:
            return str(exc), XARGS_FIELD
    return None


async def _reject(send: Send, message: str, param: str) -> None:
    body = json.dumps({
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    }).encode()
    await send({
        "type": "http.response.start",
        "status": 400,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
