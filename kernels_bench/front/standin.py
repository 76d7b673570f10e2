"""Stand-in engines for the front benchmark: a raw asyncio HTTP/1.1 server answering every
``POST`` with a canned OpenAI completion (or an SSE stream of ``--chunks`` events when the
body asks for ``"stream": true``) and every ``GET`` with a model list, with keep-alive.

It does no work per request beyond finding the end of the body, so it answers tens of
thousands of requests per second on one core: the router under test is the bottleneck.
With ``--interval-ms``, a stream's events are sent that far apart, as an engine decoding
at a fixed rate sends them (long-lived streams; one request at a time per connection).
``python -m kernels_bench.front.standin --port P [--port P2 ...] [--chunks N]
[--interval-ms MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_STREAM = re.compile(rb'"stream"\s*:\s*true')
SERVED = ("tiny-a", "tiny-b")
"""Model names the stand-ins list (gateways that discover models route by them)."""
_USAGE = {"prompt_tokens": 16, "completion_tokens": 8, "total_tokens": 24}


def _response(status: str, content_type: bytes, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: ".encode() + content_type
            + f"\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def canned(chunks: int) -> tuple[bytes, list[bytes], bytes]:
    """The complete answers: a chat completion, an SSE stream (its head and then one part
    per event), the model list."""
    completion = json.dumps({
        "id": "chatcmpl-standin", "object": "chat.completion", "created": 0,
        "model": "standin", "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": "ok"}}],
        "usage": _USAGE}).encode()
    events = [json.dumps({"id": "chatcmpl-standin", "object": "chat.completion.chunk",
                          "created": 0, "model": "standin",
                          "choices": [{"index": 0, "delta": {"content": "tok"}}]}).encode()
              for _ in range(chunks)]
    events.append(json.dumps({"id": "chatcmpl-standin", "object": "chat.completion.chunk",
                              "created": 0, "model": "standin", "choices": [],
                              "usage": _USAGE}).encode())
    stream = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
              b"transfer-encoding: chunked\r\n\r\n"]
    stream += [_chunk(b"data: " + e + b"\n\n") for e in events]
    stream.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    models = json.dumps({"object": "list", "data": [  # the names the benchmark requests
        {"id": name, "object": "model", "created": 0, "owned_by": "standin"}
        for name in SERVED]}).encode()
    return (_response("200 OK", b"application/json", completion), stream,
            _response("200 OK", b"application/json", models))


class StandinProtocol(asyncio.Protocol):
    """One connection: answers each complete request in order."""

    def __init__(self, answers: tuple[bytes, list[bytes], bytes],
                 interval_s: float = 0.0) -> None:
        self._answers = answers
        self._stream = b"".join(answers[1])
        self._interval_s = interval_s
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._buffer[:end]
            match = _LENGTH.search(head)
            total = end + 4 + (int(match.group(1)) if match else 0)
            if len(self._buffer) < total:
                return
            body, self._buffer = self._buffer[end + 4:total], self._buffer[total:]
            completion, stream, models = self._answers
            assert self._transport is not None
            if head.startswith(b"GET"):
                self._transport.write(models)
            elif not _STREAM.search(body):
                self._transport.write(completion)
            elif self._interval_s:
                asyncio.ensure_future(self._paced(stream))
            else:
                self._transport.write(self._stream)

    async def _paced(self, parts: list[bytes]) -> None:
        assert self._transport is not None
        self._transport.write(parts[0] + parts[1])
        for part in parts[2:]:
            await asyncio.sleep(self._interval_s)
            if self._transport.is_closing():
                return
            self._transport.write(part)


async def serve(ports: list[int], chunks: int, host: str = "127.0.0.1",
                interval_ms: float = 0.0) -> None:
    """Listen on every port until cancelled."""
    answers = canned(chunks)
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(lambda: StandinProtocol(answers, interval_ms / 1e3),
                                        host, port,
                                        backlog=4096, reuse_address=True)
               for port in ports]
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels_bench.front.standin",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, action="append", required=True)
    parser.add_argument("--chunks", type=int, default=8, help="SSE events per stream")
    parser.add_argument("--interval-ms", type=float, default=0.0,
                        help="pause between a stream's events (0: all at once)")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.port, args.chunks, interval_ms=args.interval_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
