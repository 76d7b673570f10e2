"""Reading a request body in the router's front (``router.routes.http.read_body``) from an
aiohttp stream reader fed as the server's protocol feeds it."""

from __future__ import annotations

import asyncio
from typing import Callable

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from router.routes.http import MAX_BODY_BYTES, ClientDisconnected, read_body
from router.request import RequestError


def read(feed: Callable[[aiohttp.StreamReader], None]) -> bytes:
    async def go() -> bytes:
        loop = asyncio.get_running_loop()
        reader = aiohttp.StreamReader(BaseProtocol(loop), 2**26, loop=loop)  # never pauses
        feed(reader)
        return await read_body(reader)
    return asyncio.run(go())


def test_a_client_that_leaves_while_sending_is_a_disconnect_not_a_crash() -> None:
    def feed(reader: aiohttp.StreamReader) -> None:
        reader.feed_data(b'{"messa')
        reader.set_exception(ConnectionResetError("Connection lost"))  # what aiohttp sets
    with pytest.raises(ClientDisconnected):
        read(feed)


def test_a_body_over_the_limit_is_a_413() -> None:
    def feed(reader: aiohttp.StreamReader) -> None:
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 1):
            reader.feed_data(b"x" * (1 << 20))
        reader.feed_eof()
    with pytest.raises(RequestError) as info:
        read(feed)
    assert info.value.status == 413


def test_a_whole_body_is_read() -> None:
    def feed(reader: aiohttp.StreamReader) -> None:
        reader.feed_data(b"ab")
        reader.feed_data(b"c")
        reader.feed_eof()
    assert read(feed) == b"abc"
