"""The live engine client (``router.engine_client``): one pooled aiohttp client session,
SSE relayed event by event.

aiohttp's connector hands out pooled connections at a cost that does not grow with the
number of open ones (httpx's pool checked every pooled socket per request: docs/research/performance.md).
Transport failures become ``UpstreamError`` with the status the client gets:
503 when the engine cannot be reached (the request never left the router, so the caller
may route it elsewhere), 504 on a timeout, 502 when the connection broke mid-request.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Literal, Mapping

import aiohttp
import msgspec

from router.engine_client import EngineCall, StreamResult
from router.request import RequestError

CONNECT_TIMEOUT_S = 5.0
IDLE_KEEPALIVE_S = 4.0
"""How long an idle pooled connection to an engine is kept: under vLLM's own 5 s
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``), so the router does not send a request on a
connection the engine is closing at that instant (which would fail it as unanswered
and re-route it)."""

ErrorKind = Literal["connect", "timeout", "protocol", "status"]
_EVENT_END = re.compile(rb"\r?\n\r?\n")


class UpstreamError(Exception):
    """An engine call that failed; ``kind`` is ``connect``, ``timeout``, ``protocol`` or
    ``status`` (the engine answered with a 5xx)."""

    def __init__(self, kind: ErrorKind, status: int, message: str,
                 unanswered: bool = False) -> None:
        """``unanswered``: the engine sent no byte of a response (the request may go to
        another engine without the client ever knowing)."""
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.unanswered = unanswered

    def error(self) -> RequestError:
        """The OpenAI error object the client receives (with ``retry-after``: another
        engine, or this one back, may answer a second later)."""
        type_ = {503: "service_unavailable", 504: "timeout"}.get(self.status, "upstream_error")
        return RequestError(self.status, str(self), type_=type_, code=f"upstream_{self.kind}",
                            retry_after_s=1)


def _map(exc: BaseException, engine: str) -> UpstreamError:
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return UpstreamError("connect", 503, f"engine '{engine}' is unreachable: {exc!r}")
    if isinstance(exc, asyncio.TimeoutError):  # aiohttp.SocketTimeoutError among them
        return UpstreamError("timeout", 504, f"engine '{engine}' timed out: {exc!r}")
    return UpstreamError("protocol", 502, f"engine '{engine}' broke the connection: {exc!r}")


_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.TimeoutError) and not isinstance(
        exc, aiohttp.ConnectionTimeoutError)


@dataclass(frozen=True)
class StreamTimeouts:
    """Silences a streamed response may have (``[router] stream_*_timeout_s``)."""

    first_byte_s: float
    stall_s: float


class Upstream:
    """Pooled HTTP client for every engine, an ``EngineClient`` (create it inside the
    running event loop)."""

    def __init__(self, read_timeout_s: float, max_connections: int,
                 stream: StreamTimeouts) -> None:
        """``read_timeout_s``: the longest silence from an engine (``[router]
        request_timeout_s``; a long non-streamed generation sends nothing until the end).
        ``max_connections``: to all engines together; the router admits no more requests
        than that (``[router] max_inflight``), so none waits for the pool. ``stream``: the
        silences a streamed response may have instead, enforced by aiohttp's own read
        timer (re-armed per read at no extra cost; a Python timer per event cost 7 us)."""
        self._stream = stream
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=stream.first_byte_s)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0,
                                           keepalive_timeout=IDLE_KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                          sock_read=read_timeout_s),
            auto_decompress=False,  # bytes pass through as the engine sent them
            trust_env=False,  # never send engine traffic through an HTTP(S)_PROXY
            skip_auto_headers=("User-Agent",),
        )

    async def aclose(self) -> None:
        await self._session.close()

    async def send(self, call: EngineCall) -> HttpReply:
        """``call`` POSTed to its engine (``open``); the reply with its body unread."""
        engine = call.decision.instance
        resp = await self.open(engine, call.url, call.body, call.headers, call.parsed.stream,
                               call.method)
        return HttpReply(self, engine, resp)

    async def open(self, engine: str, url: str, body: bytes, headers: Mapping[str, str],
                   stream: bool = False, method: str = "POST") -> aiohttp.ClientResponse:
        """Send ``body`` to ``url`` (``method``, POST by default) and return the response
        with its body unread (``stream``: its headers within the first-byte timeout).

        A 5xx answer is read, closed and raised as ``UpstreamError`` (kind ``status``);
        other statuses are returned (the caller releases them).
        """
        try:
            if stream:
                resp = await self._session.request(method, url, data=body or None,
                                                   headers=headers,
                                                   timeout=self._stream_timeout)
            else:
                resp = await self._session.request(method, url, data=body or None,
                                                   headers=headers)
        except _FAILURES as exc:
            error = self._silent(engine, False) if stream and _is_timeout(exc) \
                else _map(exc, engine)
            error.unanswered = True
            raise error from None
        if resp.status >= 500:
            detail = (await self.read(engine, resp)).decode("utf-8", "replace")[:500]
            raise UpstreamError("status", 502,
                                f"engine '{engine}' answered {resp.status}: {detail}")
        return resp

    async def events(self, engine: str, resp: aiohttp.ClientResponse, result: StreamResult,
                     keep_usage: bool) -> AsyncIterator[bytes]:
        """``relay_events`` of a response ``open`` returned with ``stream``; a silence
        longer than the stream timeouts raises ``UpstreamError`` (kind ``timeout``) naming
        the setting. The caller releases the response."""
        first = True

        def first_event() -> None:  # from now on, the stall limit between reads
            nonlocal first
            first = False
            connection = resp.connection
            if connection is not None and connection.protocol is not None:
                connection.protocol.read_timeout = self._stream.stall_s
                connection.protocol.start_timeout()

        try:
            async for event in relay_events(engine, resp.content.iter_any(), result,
                                            keep_usage, first_event):
                yield event
        except UpstreamError as exc:
            if exc.kind == "timeout":
                raise self._silent(engine, not first) from None
            raise

    def _silent(self, engine: str, started: bool) -> UpstreamError:
        limit, what, setting = ((self._stream.stall_s, "between two events", "stall")
                                if started else (self._stream.first_byte_s,
                                                 "before its first event", "first_byte"))
        return UpstreamError("timeout", 504, f"engine '{engine}' sent nothing for {limit:g} s "
                             f"{what} (router.stream_{setting}_timeout_s)")

    @staticmethod
    async def read(engine: str, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body of ``resp``, which is then released."""
        try:
            return await resp.read()
        except _FAILURES as exc:
            raise _map(exc, engine) from None
        finally:
            resp.release()


class HttpReply:
    """An engine's HTTP response as an ``EngineReply``."""

    def __init__(self, upstream: Upstream, engine: str, resp: aiohttp.ClientResponse) -> None:
        self._upstream, self._engine, self._resp = upstream, engine, resp
        self.status = resp.status
        self.content_type = resp.headers.get("content-type", "application/json")

    async def read(self) -> bytes:
        return await self._upstream.read(self._engine, self._resp)

    def events(self, result: StreamResult, keep_usage: bool) -> AsyncIterator[bytes]:
        return self._upstream.events(self._engine, self._resp, result, keep_usage)

    def cancel(self) -> None:
        """Release the response: a body not read to its end closes the connection,
        which vLLM's server takes as the request's abort."""
        self._resp.release()


class _Usage(msgspec.Struct):
    completion_tokens: int = 0
    output_tokens: int = 0
    """The agents' APIs' name of it."""

    @property
    def tokens(self) -> int:
        return self.completion_tokens or self.output_tokens


class _Response(msgspec.Struct):
    """The Responses API's response object, inside its stream's events."""

    id: str | None = None
    usage: _Usage | None = None


class _Counted(msgspec.Struct):
    """The fields of a response body or stream event the router reads; the rest is
    skipped."""

    usage: _Usage | None = None
    choices: list[msgspec.Raw] | None = None
    id: str | None = None
    response: _Response | None = None


_decode_counted = msgspec.json.Decoder(_Counted).decode


def _decoded(body: bytes) -> _Counted | None:
    try:
        return _decode_counted(body)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return None


def completion_tokens(body: bytes) -> int:
    """``usage.completion_tokens`` (or ``output_tokens``) of a JSON response body, 0 if
    absent."""
    counted = _decoded(body)
    return 0 if counted is None or counted.usage is None else counted.usage.tokens


def response_id(body: bytes) -> str | None:
    """The ``id`` of a JSON response body (a Responses-API response's), if any."""
    counted = _decoded(body)
    return None if counted is None or not isinstance(counted.id, str) else counted.id


async def relay_events(engine: str, chunks: AsyncIterator[bytes], result: StreamResult,
                       keep_usage: bool, on_first: Callable[[], None] | None = None
                       ) -> AsyncIterator[bytes]:
    """Yield the server-sent events of a response body (``chunks``) as soon as they are
    complete: all those one read completed, joined (one write to the client).

    Records the output tokens from usage chunks into ``result``; the usage-only chunk
    (empty ``choices``) is dropped unless ``keep_usage``. ``on_first`` is called when the
    first bytes arrive. The caller releases the response.
    """
    buffer = b""
    events = 0
    try:
        async for data in chunks:
            if on_first is not None:
                on_first()
                on_first = None
            buffer += data
            *complete, buffer = _EVENT_END.split(buffer)
            out = []
            for event in complete:
                events += 1
                if not result.usage_seen:
                    result.output_tokens = events
                if not (_usage(event, result) and not keep_usage):
                    out.append(event + b"\n\n")
            if out:
                yield b"".join(out)
    except _FAILURES as exc:
        raise _map(exc, engine) from None
    if buffer.strip():
        yield buffer


def _usage(event: bytes, result: StreamResult) -> bool:
    """Record usage (and a Responses-API response id) from an event; True if it is a
    chat usage-only chunk. An agents' API event names its type first (``event: ...``),
    then its ``data:``; only events that carry a usage (every Responses lifecycle event,
    Messages' start and delta) are decoded."""
    if b'"usage"' not in event:
        return False
    field = event.find(b"data:")  # 0 for chat's chunks, after the ``event:`` line else
    chunk = _decoded(event[field + 5:]) if field >= 0 else None
    if chunk is None:
        return False
    usage = chunk.usage
    if chunk.response is not None:
        result.response_id = result.response_id or chunk.response.id
        usage = chunk.response.usage
    if usage is None:
        return False
    result.output_tokens = usage.tokens
    result.usage_seen = True
    return chunk.choices == []
