"""ZeroMQ subscription to one telemetry stream kind (snapshots or KV events).

One SUB socket per distinct endpoint (engines may share one: the topic tells them
apart). The router binds tcp:// endpoints and connects to ipc:// ones
(``engine_ext.telemetry.subscriber_binds``). Every frame goes through a
``FrameDecoder``: malformed frames are counted and dropped, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Iterable

import zmq
import zmq.asyncio

from engine_ext.telemetry import FrameDecoder, subscriber_binds

Handler = Callable[[str, int, Any], None]
"""(topic, sequence number, decoded object) -> None."""


class StreamSubscriber:
    def __init__(self, endpoints: Iterable[str], decoder: FrameDecoder,
                 handle: Handler) -> None:
        self.endpoints = sorted(set(endpoints))
        self.decoder = decoder
        self._handle = handle
        self._sockets: list[zmq.asyncio.Socket] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, ctx: zmq.asyncio.Context) -> None:
        for ep in self.endpoints:
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.SUBSCRIBE, b"")  # topics are filtered exactly, not by prefix
            self._sockets.append(sock)
            try:
                sock.bind(ep) if subscriber_binds(ep) else sock.connect(ep)
            except zmq.ZMQError as exc:
                await self.stop()
                raise ValueError(f"cannot {'bind' if subscriber_binds(ep) else 'connect'} "
                                 f"telemetry endpoint {ep}: {exc}") from None
            self._tasks.append(asyncio.create_task(self._run(sock), name=f"sub {ep}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self._sockets:
            sock.close(linger=0)
        self._tasks, self._sockets = [], []

    def feed(self, frames: list[bytes]) -> None:
        """Decode and dispatch one multipart message."""
        decoded = self.decoder.decode(frames)
        if decoded is not None:
            self._handle(*decoded)

    async def _run(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            self.feed(await sock.recv_multipart())
