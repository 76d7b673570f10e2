"""Proxying to engines: one pooled ``httpx.AsyncClient``, SSE relayed event by event.

Transport failures become ``UpstreamError`` with the status the client gets:
503 when the engine cannot be reached (the request never left the router, so the caller
may route it elsewhere), 504 on a timeout, 502 when the connection broke mid-request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal

import httpx

from router.request import RequestError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0
"""Longest silence from an engine (a long non-streamed generation sends nothing until the
end)."""

ErrorKind = Literal["connect", "timeout", "protocol", "status"]
_EVENT_END = re.compile(rb"\r?\n\r?\n")


class UpstreamError(Exception):
    """An engine call that failed; ``kind`` is ``connect``, ``timeout``, ``protocol`` or
    ``status`` (the engine answered with a 5xx)."""

    def __init__(self, kind: ErrorKind, status: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    def error(self) -> RequestError:
        """The OpenAI error object the client receives."""
        type_ = {503: "service_unavailable", 504: "timeout"}.get(self.status, "upstream_error")
        return RequestError(self.status, str(self), type_=type_, code=f"upstream_{self.kind}")


def _map(exc: httpx.HTTPError, engine: str) -> UpstreamError:
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return UpstreamError("connect", 503, f"engine '{engine}' is unreachable: {exc!r}")
    if isinstance(exc, httpx.PoolTimeout):
        return UpstreamError("timeout", 503, "the router's connection pool is exhausted")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError("timeout", 504, f"engine '{engine}' timed out: {exc!r}")
    return UpstreamError("protocol", 502, f"engine '{engine}' broke the connection: {exc!r}")


@dataclass
class StreamResult:
    """What a relayed response told about its generation."""

    output_tokens: int = 0
    """``usage.completion_tokens``, else (stream cut short) the number of data events."""
    usage_seen: bool = False


class Upstream:
    """Pooled HTTP client for every engine."""

    def __init__(self, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
            trust_env=False,  # never send engine traffic through an HTTP(S)_PROXY
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def open(self, engine: str, url: str, body: bytes,
                   headers: dict[str, str]) -> httpx.Response:
        """POST ``body`` to ``url`` and return the response with its body unread.

        A 5xx answer is read, closed and raised as ``UpstreamError`` (kind ``status``);
        other statuses are returned (the caller closes them).
        """
        request = self._client.build_request("POST", url, content=body, headers=headers)
        try:
            resp = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _map(exc, engine) from None
        if resp.status_code >= 500:
            detail = (await self.read(engine, resp)).decode("utf-8", "replace")[:500]
            raise UpstreamError("status", 502,
                                f"engine '{engine}' answered {resp.status_code}: {detail}")
        return resp

    @staticmethod
    async def read(engine: str, resp: httpx.Response) -> bytes:
        """The whole body of ``resp``, which is then closed."""
        try:
            return await resp.aread()
        except httpx.HTTPError as exc:
            raise _map(exc, engine) from None
        finally:
            await resp.aclose()


def completion_tokens(body: bytes) -> int:
    """``usage.completion_tokens`` of a JSON response body, 0 if absent."""
    try:
        return int(json.loads(body)["usage"]["completion_tokens"])
    except (ValueError, TypeError, KeyError, IndexError):
        return 0


async def relay_events(engine: str, resp: httpx.Response, result: StreamResult,
                       keep_usage: bool) -> AsyncIterator[bytes]:
    """Yield each server-sent event of ``resp`` as soon as it is complete.

    Records the output tokens from usage chunks into ``result``; the usage-only chunk
    (empty ``choices``) is dropped unless ``keep_usage``. The caller closes ``resp``.
    """
    buffer = b""
    events = 0
    try:
        async for data in resp.aiter_raw():
            buffer += data
            *complete, buffer = _EVENT_END.split(buffer)
            for event in complete:
                events += 1
                if not result.usage_seen:
                    result.output_tokens = events
                if _usage(event, result) and not keep_usage:
                    continue
                yield event + b"\n\n"
    except httpx.HTTPError as exc:
        raise _map(exc, engine) from None
    if buffer.strip():
        yield buffer


def _usage(event: bytes, result: StreamResult) -> bool:
    """Record usage from a ``data:`` event; True if it is a usage-only chunk."""
    if b'"usage"' not in event or not event.startswith(b"data:"):
        return False
    try:
        chunk: Any = json.loads(event[5:])
        tokens = int(chunk["usage"]["completion_tokens"])
    except (ValueError, TypeError, KeyError, IndexError):
        return False
    result.output_tokens = tokens
    result.usage_seen = True
    return chunk.get("choices") == []
