"""The engine client: how the proxy sends a routed request to its engine and gets the
answer back, whole or as a stream, or abandons it.

``router.upstream.Upstream`` is the live client (HTTP over one pooled aiohttp session);
the twin (``kernels_bench.lab.twin``) answers the same calls from simulated engines. The
proxy (``router.proxy``) builds one ``EngineCall`` per attempt and reads the
``EngineReply``: ``read`` for a whole answer, ``events`` for an SSE stream, ``cancel``
when the client leaves mid-stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Mapping, Protocol

from router.request import ParsedRequest
from router.types import Decision, RoutingRequest


@dataclass
class StreamResult:
    """What a relayed response told about its generation."""

    output_tokens: int = 0
    """``usage.completion_tokens`` (``output_tokens`` in the agents' APIs), else (stream
    cut short) the number of events."""
    usage_seen: bool = False
    response_id: str | None = None
    """The Responses API's response id (its ``response.created`` event)."""


@dataclass(frozen=True)
class EngineCall:
    """One request on its way to the engine its decision chose."""

    parsed: ParsedRequest
    """The client's request, decoded once."""
    request: RoutingRequest
    """The core's request (its id, and the prompt token ids when the router tokenized)."""
    decision: Decision
    priority: int | None
    """The ``priority`` the engine gets (``router.proxy.engine_settings``), None: none."""
    max_tokens: int | None
    """Its output bound, None: the engine's own (its context)."""
    path: str
    """The API's path (``router.request.PATHS``), or a stored response's."""
    body: bytes
    """The JSON body sent (``router.proxy.upstream_body``; empty for a GET)."""
    headers: Mapping[str, str]
    method: str = "POST"
    """``GET`` and ``DELETE`` only for a stored response (``Proxy.pass_through``)."""

    @property
    def url(self) -> str:
        return self.decision.url.rstrip("/") + self.path


class EngineReply(Protocol):
    """An engine's answer whose body is not read yet; ``read``, ``events`` or ``cancel``
    releases it."""

    status: int
    content_type: str

    async def read(self) -> bytes:
        """The whole body (``UpstreamError`` when the transport fails)."""
        ...

    def events(self, result: StreamResult, keep_usage: bool) -> AsyncIterator[bytes]:
        """The SSE events of a streamed answer as they complete, its output tokens
        recorded into ``result`` (the usage-only chunk dropped unless ``keep_usage``);
        ``UpstreamError`` on a failure or a silence longer than the stream timeouts."""
        ...

    def cancel(self) -> None:
        """Abandon the answer (the client left): what is unread is dropped and the engine
        is told the call is over."""
        ...


class EngineClient(Protocol):
    """Sends routed requests to engines (``router.proxy.Proxy`` holds one)."""

    async def send(self, call: EngineCall) -> EngineReply:
        """``call`` sent; the reply with its body unread. ``UpstreamError`` when the
        engine cannot be reached, fails before answering or answers a 5xx."""
        ...

    async def aclose(self) -> None:
        """Release what the client holds (connections)."""
        ...
