"""What the routes share: reading a bounded body, JSON responses, OpenAI error objects."""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from router.request import Kind, RequestError

MAX_BODY_BYTES = 32 * 2**20

_encode = msgspec.json.encode


class ClientDisconnected(Exception):
    """The client went away before the response was complete."""


def json_response(body: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_encode(body), status=status, headers=headers,
                        content_type="application/json")


def error_response(exc: RequestError, kind: Kind | None = None) -> web.Response:
    """``exc`` as an OpenAI error object (Anthropic's for ``kind`` ``messages``), with
    ``retry-after`` when it has one."""
    headers = None if exc.retry_after_s is None else {"retry-after": str(exc.retry_after_s)}
    return json_response(exc.body(kind), exc.status, headers)


async def read_body(content: aiohttp.StreamReader) -> bytes:
    """The request body, at most ``MAX_BODY_BYTES`` (413 beyond); ClientDisconnected if
    the client leaves while sending."""
    chunks, size = [], 0
    try:
        async for chunk in content.iter_any():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise RequestError(413, f"request body exceeds {MAX_BODY_BYTES} bytes",
                                   code="body_too_large")
            chunks.append(chunk)
    except (aiohttp.ClientPayloadError, ConnectionError):  # nobody left to answer
        raise ClientDisconnected() from None
    return b"".join(chunks)
