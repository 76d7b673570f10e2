"""Reading a request body in the router's front (``router.app._read_body``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from router.app import MAX_BODY_BYTES, ClientDisconnected, _read_body
from router.request import RequestError


def request(messages: list[dict[str, Any]]) -> Request:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions",
                    "headers": []}, receive)


def test_a_client_that_leaves_while_sending_is_a_disconnect_not_a_crash() -> None:
    req = request([{"type": "http.request", "body": b'{"messa', "more_body": True},
                   {"type": "http.disconnect"}])
    with pytest.raises(ClientDisconnected):
        asyncio.run(_read_body(req))


def test_a_body_over_the_limit_is_a_413() -> None:
    chunk = b"x" * (1 << 20)
    parts = [{"type": "http.request", "body": chunk, "more_body": True}
             for _ in range(MAX_BODY_BYTES // len(chunk) + 1)]
    with pytest.raises(RequestError) as info:
        asyncio.run(_read_body(request(parts)))
    assert info.value.status == 413


def test_a_whole_body_is_read() -> None:
    req = request([{"type": "http.request", "body": b"ab", "more_body": True},
                   {"type": "http.request", "body": b"c", "more_body": False}])
    assert asyncio.run(_read_body(req)) == b"abc"
