"""The benchmark clients' one resend (``kernels_bench.faults.signals``): a request whose
pooled keep-alive connection its server had closed, found before a byte was written, is
sent once more on a new connection and marked; one the server received never is. Against
a loopback server that counts the requests it reads."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
import pytest

from kernels_bench.faults.signals import ClosedLoop, transport_outcome

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Twice(ClosedLoop):
    """One client sending two requests in a row, on its session's pooled connection."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "m", concurrency=1, timeout_s=10)
        self.got: list[tuple[str, bool]] = []

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        for _ in range(2):
            request = SimpleNamespace(resent=False)
            try:
                async with await self._post(session, {"n": 1}, request) as resp:
                    await resp.read()
                    outcome = "ok"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcome = transport_outcome(exc)
            self.got.append((outcome, request.resent))


@pytest.mark.parametrize("answer, got, received", [
    # the server answers and closes at once: the second request finds the pooled
    # connection closed before writing, never reaches the server, and is resent
    (True, [("ok", False), ("ok", True)], 2),
    # the server reads each request and closes without an answer: both reached it, and
    # neither is sent again
    (False, [("cut", False), ("cut", False)], 2),
])
def test_only_a_request_that_never_left_is_resent(answer: bool, got: list[tuple[str, bool]],
                                                  received: int) -> None:
    async def go() -> tuple[list[tuple[str, bool]], int]:
        count = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal count
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            count += 1
            if answer:
                writer.write(ANSWER)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            client = Twice(f"http://127.0.0.1:{port}")
            await client._main()
        return client.got, count

    assert asyncio.run(go()) == (got, received)
