"""ZeroMQ subscription to one telemetry stream kind (snapshots or KV events).

One SUB socket per distinct endpoint (engines may share one: the topic tells them
apart). The router binds tcp:// endpoints and connects to ipc:// ones
(``engine_ext.telemetry.subscriber_binds``).

The receive loop survives garbage: the socket refuses any message part larger than
``MAX_MESSAGE_BYTES`` (ZeroMQ drops the connection; a publisher that connected reconnects
by itself, an endpoint the router connected to is connected anew by ``_reconnect``), every
frame goes through a total ``FrameDecoder`` (malformed, unknown and out-of-sequence frames
are counted and dropped), and an exception the state update raises for one frame is
counted and the frame skipped (``errors``). Each kind is logged at most once per
``LOG_INTERVAL_S`` per stream, with the count since the previous line. A loop ends only
when cancelled (``stop``) or when its socket is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Callable, Iterable

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from engine_ext.curve import RouterCurve
from engine_ext.telemetry import FrameDecoder, subscriber_binds

Handler = Callable[[str, int, Any], None]
"""(topic, sequence number, decoded object) -> None."""

MAX_MESSAGE_BYTES = 64 << 20
"""Largest message part a SUB socket takes (``zmq.MAXMSGSIZE``). The largest legitimate
part is a KV event batch: vLLM publishes one per engine step, whose ``BlockStored`` events
carry the token ids (at most 5 bytes each in msgpack) and hashes (at most 34 bytes) of
the blocks the step filled, and whose ``BlockRemoved`` events carry the hashes of the
blocks it evicted: for a step over a whole 1M-token prompt about 5 MiB plus 2 MiB of
hashes. A snapshot is at most ``max_num_seqs`` finished requests, ~100 KiB. 64 MiB is
over 8x the largest batch and bounds what one garbage message costs."""

LOG_INTERVAL_S = 10.0
"""At most one warning per stream and kind (dropped frames, failed updates) this often."""

log = logging.getLogger("hetserve.router")


class _RateLimitedWarning:
    """A warning logged at most once per ``LOG_INTERVAL_S``, with the count since the
    previous one (the first occurrence is logged at once)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._count = 0
        self._next = float("-inf")

    def __call__(self, detail: str, exc: BaseException | None = None) -> None:
        self._count += 1
        now = time.monotonic()
        if now >= self._next:
            log.warning("%s: %d since the last report (latest: %s)", self.what, self._count,
                        detail, exc_info=exc)
            self._count, self._next = 0, now + LOG_INTERVAL_S


class StreamSubscriber:
    def __init__(self, stream: str, endpoints: Iterable[str], decoder: FrameDecoder,
                 handle: Handler, curve: RouterCurve | None = None) -> None:
        """``stream``: the stream's name in logs (``snapshot``, ``kv``); ``curve``: every
        socket a CURVE server (``engine_ext.curve``; the caller runs the ZAP handler)."""
        self.stream = stream
        self.curve = curve
        self.endpoints = sorted(set(endpoints))
        self.decoder = decoder
        self._handle = handle
        self.errors = 0
        """Frames whose state update raised (skipped)."""
        self._warn_malformed = _RateLimitedWarning(f"{stream} telemetry: malformed frames")
        self._warn_error = _RateLimitedWarning(f"{stream} telemetry: state update failed")
        self._warn_dropped = _RateLimitedWarning(f"{stream} telemetry: connection dropped, "
                                                 "reconnecting")
        self._open: dict[str, tuple[list[zmq.asyncio.Socket], list[asyncio.Task[None]]]] = {}
        """Per endpoint: its SUB socket (and monitor, if it connects) and its tasks (the
        receive loop, and the reconnect watcher)."""
        self._ctx: zmq.asyncio.Context | None = None

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The receive loops, one per endpoint."""
        return [tasks[0] for _, tasks in self._open.values()]

    async def start(self, ctx: zmq.asyncio.Context) -> None:
        self._ctx = ctx
        for ep in self.endpoints:
            try:
                self.add(ep)
            except ValueError:
                await self.stop()
                raise

    def add(self, ep: str) -> None:
        """Subscribe to one more endpoint (nothing if it is subscribed already;
        ValueError if it cannot be bound or connected)."""
        if ep in self._open:
            return
        assert self._ctx is not None, "start() first"
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # topics are filtered exactly, not by prefix
        if self.curve is not None:
            self.curve.apply(sock)
        binds = subscriber_binds(ep)
        try:
            sock.bind(ep) if binds else sock.connect(ep)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ValueError(f"cannot {'bind' if binds else 'connect'} telemetry "
                             f"endpoint {ep}: {exc}") from None
        sockets, tasks = [sock], [asyncio.create_task(self._run(sock),
                                                      name=f"sub {self.stream} {ep}")]
        if not binds:
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sockets.append(monitor)
            tasks.append(asyncio.create_task(self._reconnect(sock, monitor, ep),
                                             name=f"reconnect {self.stream} {ep}"))
        self._open[ep] = (sockets, tasks)
        if ep not in self.endpoints:
            self.endpoints = sorted({*self.endpoints, ep})

    async def remove(self, ep: str) -> None:
        """Stop listening on ``ep`` (nothing if it is not subscribed)."""
        await self._close(ep)
        self.endpoints = [e for e in self.endpoints if e != ep]

    async def stop(self) -> None:
        for ep in list(self._open):
            await self._close(ep)

    async def _close(self, ep: str) -> None:
        sockets, tasks = self._open.pop(ep, ([], []))
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in sockets:
            sock.close(linger=0)

    def feed(self, frames: list[bytes]) -> None:
        """Decode and dispatch one multipart message; never raises for a bad frame."""
        malformed = self.decoder.malformed
        decoded = self.decoder.decode(frames)
        if self.decoder.malformed != malformed:
            self._warn_malformed(str(self.decoder.last_error))
        if decoded is None:
            return
        try:
            self._handle(*decoded)
        except Exception as exc:  # one frame's failed update must not end the stream
            self.errors += 1
            self._warn_error(f"{type(exc).__name__}: {exc}", exc)

    async def _run(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            self.feed(await sock.recv_multipart())

    async def _reconnect(self, sock: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket,
                         ep: str) -> None:
        """Connect ``ep`` anew whenever its connection drops. ZeroMQ reconnects by itself
        after a connection error, but gives a connected endpoint up for good after a
        protocol error: a part over ``MAX_MESSAGE_BYTES``, a failed handshake."""
        while True:
            await recv_monitor_message(monitor)
            self._warn_dropped(ep)
            with contextlib.suppress(zmq.ZMQError):  # already given up by ZeroMQ
                sock.disconnect(ep)
            try:
                sock.connect(ep)
            except zmq.ZMQError as exc:
                self._warn_dropped(f"{ep}: cannot connect again: {exc}")
