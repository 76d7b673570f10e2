"""The benchmark clients' resend rule: when a request is sent once more, on a new connection.

A request is sent again at most once, and only when its connection failed before any byte
of a response came back:

- ``unsent`` (counted as ``resent``): aiohttp found the pooled keep-alive connection closed
  (its server had closed it) when it came to write the request, whose headers and small
  body go out in that one write: not a byte of it left the client.
- ``unanswered`` (counted as ``resent_unanswered``): the request was written, then the
  connection was reset or closed (``ClientOSError``, ``ServerDisconnectedError``) before a
  byte of the response, not even of its status line, arrived. The server may have read
  it: a router worker that forwarded it and then died leaves it running on an engine, so
  a resend can run a call twice. It is what the OpenAI Python SDK does by default (it
  retries connection errors, ``max_retries=2``); only an idempotency key that every worker
  checks would make it safe, and none is built (docs/reliability.md).

A request whose connection failed after any response byte (a status line, headers, part of
a body) is never sent again, nor one that timed out or found no server (refused).

Which bytes came back is known only to the connection's protocol, so the clients' session
uses ``AnswerTracking``: a connector whose protocol counts the bytes read since the current
request was sent (aiohttp calls ``set_response_params`` once per request on the connection
it sends it on) and records each connection error it hands on with none.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

_UNANSWERED: weakref.WeakSet[BaseException] = weakref.WeakSet()
"""The connection errors a protocol raised before any byte of its current response."""


class _CountingHandler(ResponseHandler):
    """aiohttp's protocol, counting the bytes read since the current request was sent."""

    response_bytes = 0

    def set_response_params(self, **kwargs: Any) -> None:
        self.response_bytes = 0  # a new request on this connection
        super().set_response_params(**kwargs)

    def data_received(self, data: bytes) -> None:
        self.response_bytes += len(data)
        super().data_received(data)

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        if self.response_bytes == 0:
            _UNANSWERED.add(exc)
        super().set_exception(exc, *args, **kwargs)


class AnswerTracking(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose connections know whether their request got any response
    byte (``unanswered``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = functools.partial(_CountingHandler, loop=self._loop)


def unsent(exc: BaseException) -> bool:
    """Whether a request provably never reached the server: aiohttp found its connection
    closing (a pooled keep-alive connection the server had closed) when it came to write
    the request, whose headers and small body go out in that one write, so not a byte of
    it was sent."""
    return isinstance(exc, aiohttp.ClientOSError) \
        and isinstance(exc.__cause__, aiohttp.ClientConnectionResetError)


def unanswered(exc: BaseException) -> bool:
    """Whether a request's connection was reset or closed before any byte of its response
    came back (on an ``AnswerTracking`` connection): it may have reached the server."""
    return isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)) \
        and not isinstance(exc, aiohttp.ClientConnectorError) and exc in _UNANSWERED
