"""The benchmark clients' one resend (``kernels_bench.lab.faults.resend``): a request whose
connection failed before any byte of an answer came back is sent once more on a new
connection and marked, ``resent`` if it never left the client (a pooled keep-alive
connection its server had closed, found before a byte was written), ``resent_unanswered``
if it was written and the connection was then closed or reset; one that got any byte of an
answer never is. Against a loopback server that counts the requests it reads."""

from __future__ import annotations

import asyncio
import socket
import struct
from types import SimpleNamespace

import aiohttp
import pytest

from kernels_bench.lab.faults.signals import ClosedLoop, transport_outcome

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Twice(ClosedLoop):
    """One client sending two requests in a row, on its session's pooled connection."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "m", concurrency=1, timeout_s=10)
        self.got: list[tuple[str, bool, bool]] = []

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        for _ in range(2):
            request = SimpleNamespace(resent=False, resent_unanswered=False)
            try:
                async with await self._post(session, {"n": 1}, request) as resp:
                    await resp.read()
                    outcome = "ok"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcome = transport_outcome(exc)
            self.got.append((outcome, request.resent, request.resent_unanswered))


CUT, CUT_RESENT = ("cut", False, False), ("cut", False, True)


@pytest.mark.parametrize("server, got, received", [
    # answers and closes at once: the second request finds the pooled connection closed
    # before writing, never reaches the server, and is resent
    ("answer", [("ok", False, False), ("ok", True, False)], 2),
    # reads each request and closes (FIN), or resets (RST), without a byte of an answer:
    # each is sent once more (and cut again)
    ("close", [CUT_RESENT, CUT_RESENT], 4),
    ("reset", [CUT_RESENT, CUT_RESENT], 4),
    # a byte of an answer came back: never sent again, whatever came of it
    ("partial status line", [CUT, CUT], 2),
    ("partial body", [CUT, CUT], 2),
])
def test_only_a_request_without_an_answer_byte_is_resent(
        server: str, got: list[tuple[str, bool, bool]], received: int) -> None:
    async def go() -> tuple[list[tuple[str, bool, bool]], int]:
        count = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal count
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            count += 1
            if server == "reset":
                writer.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            writer.write({"answer": ANSWER, "close": b"",
                          "partial status line": b"HTTP/1.1 20",
                          "partial body": ANSWER[:-2].replace(b"length: 2", b"length: 9")
                          + b"{"}[server])
            await writer.drain()
            writer.close()

        server_ = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server_:
            port = server_.sockets[0].getsockname()[1]
            client = Twice(f"http://127.0.0.1:{port}")
            await client._main()
        return client.got, count

    assert asyncio.run(go()) == (got, received)
