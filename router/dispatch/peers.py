"""Router workers: N router processes serve one port, and share what must be shared.

With ``[router] workers = N`` the kernel spreads the clients' connections over N router
processes bound to one port (``SO_REUSEPORT``, ``python -m router --worker I``). Each
subscribes to every engine's telemetry and KV events itself and keeps its own in-flight
ledger: load is read from the engines, so nothing of that needs sharing. Two things do:

- the program table: a program's next stage may reach any worker, and must go to the
  model its first stage got (Chimera's stickiness) and, load permitting, the engine its
  last one did (``router.policies.affinity``);
- engine marks by the launcher or an operator (``POST /admin/engines/...``), which reach
  one worker through the shared port.

Each worker publishes those changes on its own ZeroMQ PUB socket (``ipc://`` in
``[router] sync_dir``) and applies its peers' (one SUB socket connected to all of them).
A program's stages are sequential (the next is sent after the last one answered), so a
peer has the change long before the program's next call. A worker that restarts starts
with an empty table: a program whose next stage reaches it first is routed afresh.

Admin calls to different workers at once can conflict (a down to one, an up to another;
two adds of one name), and their events cross. Each engine event (``Marked``, ``Moved``,
``Added``, ``Removed``) therefore carries its engine's ``Version``, a Lamport clock
(counter, worker index; ``router.state.engine_versions``): a worker applies a peer's
event only if it is newer than what it holds for what the event sets (the add or
removal, the admin mark, the URL), so every worker ends with the last writer's change
whatever the arrival order; an older one is counted (``stale``) and dropped. A removal
leaves a tombstone (bounded), so a late older add does not bring the engine back. The
marks a worker sets itself (a failed call's breaker, the health prober, silent
telemetry) are its own observations: they are not published. A worker that starts (or
restarts: it holds the cluster file's engines, counter 0) says ``Hello`` until every
peer answered, or for ``JOIN_TIMEOUT_S``: each peer sends it every versioned register it
holds (``State``: an add with its entry, a removal, a mark, a move, each with its
version), then ``Synced``; the joining worker applies them by the same rule as any change,
its own from before the restart included, so it ends with what the others hold. Its own
calls are stamped at least with the wall clock in ms (one host, one clock), so they win
over the older changes it has not heard of yet.

The receive loop is as total as the telemetry's: bounded message size, a strict decoder
(a version's counter is 1..2**63-1 and its worker index below ``MAX_WORKERS``, else the
message is malformed), an event naming an unknown model or engine (a mark's or move's
version is kept for the engine's add, which it may have overtaken), or a version of a
worker not in the cluster, counted and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Annotated, Callable, Iterable

import msgspec
import zmq
import zmq.asyncio

from router.config.engines import MAX_NODE_CHARS
from router.request import MAX_LABEL_CHARS
from router.settings import MAX_NAME_CHARS, MAX_WORKERS
from router.state.engine_versions import Version

MAX_PEER_MESSAGE_BYTES = 64 << 10
"""Largest message a worker takes from a peer (an event is a few hundred bytes)."""
MAX_URL_CHARS = 1024
"""Longest engine URL a ``Moved`` event carries."""
MAX_ENTRY_CHARS = 16384
"""Longest engine entry (JSON) an ``Added`` event carries."""
MAX_REASON_CHARS = 1024
"""Longest reason a ``Marked`` event carries (the admin API refuses longer ones)."""
JOIN_TIMEOUT_S = 10.0
"""How long a starting worker says ``Hello`` while a peer has not answered (a dead one
never does)."""
JOIN_FIRST_S, JOIN_MAX_S = 0.05, 2.0
"""The first and the longest interval between two ``Hello``s (doubling): ZeroMQ drops
what a new PUB socket sends before a peer's SUB reconnected to it."""

_Label = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)]
_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]


class Routed(msgspec.Struct, tag="routed", array_like=True, frozen=True):
    """A stage of ``program_id`` was routed to ``model``, on engine ``engine``."""

    program_id: _Label
    model: _Name
    engine: _Name | None = None


class Completed(msgspec.Struct, tag="completed", array_like=True, frozen=True):
    """A stage of ``program_id`` ended."""

    program_id: _Label
    final: bool
    error: bool


class Marked(msgspec.Struct, tag="marked", array_like=True, frozen=True):
    """The launcher or an operator marked ``instance`` up or down."""

    instance: _Name
    version: Version
    up: bool
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON_CHARS)]


class Moved(msgspec.Struct, tag="moved", array_like=True, frozen=True):
    """The launcher restarted ``instance`` on another port (or Ray node ``node``): its URL
    is now ``url``."""

    instance: _Name
    version: Version
    url: Annotated[str, msgspec.Meta(max_length=MAX_URL_CHARS)]
    node: Annotated[str, msgspec.Meta(max_length=MAX_NODE_CHARS)] | None = None


class Added(msgspec.Struct, tag="added", array_like=True, frozen=True):
    """The launcher added engine ``instance``: ``entry`` is its cluster-file table, as
    JSON (named ``instance``)."""

    instance: _Name
    version: Version
    entry: Annotated[str, msgspec.Meta(max_length=MAX_ENTRY_CHARS)]


class Removed(msgspec.Struct, tag="removed", array_like=True, frozen=True):
    """The launcher removed ``instance`` (drained and stopped)."""

    instance: _Name
    version: Version


EngineEvent = Marked | Moved | Added | Removed
"""The events that change an engine's admin state: each carries its ``Version``."""
_Worker = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORKERS)]


class Hello(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    """Worker ``worker`` started: each peer sends it what it holds (``State``)."""

    worker: _Worker


class State(msgspec.Struct, tag="state", array_like=True, frozen=True):
    """One of a peer's versioned registers, for worker ``to``, which said ``Hello``."""

    to: _Worker
    event: EngineEvent


class Synced(msgspec.Struct, tag="synced", array_like=True, frozen=True):
    """Worker ``peer`` sent worker ``to`` every register it holds."""

    to: _Worker
    peer: _Worker


PeerEvent = Routed | Completed | Marked | Moved | Added | Removed | Hello | State | Synced

log = logging.getLogger("hetserve.router.peers")


def sync_endpoints(sync_dir: str, port: int, workers: int) -> list[str]:
    """The ipc endpoint each worker publishes on, by worker index."""
    return [f"ipc://{os.path.join(sync_dir, f'router-{port}-{i}.sync')}"
            for i in range(workers)]


class Peers:
    """This worker's link to the others: ``publish`` a change, ``apply`` theirs."""

    def __init__(self, endpoints: list[str], worker: int,
                 apply: Callable[[PeerEvent], bool],
                 registers: Callable[[], Iterable[EngineEvent]] = tuple) -> None:
        """``apply``: applies a peer's event (a ``State`` for this worker: a peer's
        register); False when the event is older than what it would change (dropped),
        ValueError when it names what is not here. ``registers``: the versioned registers
        this worker holds, as events, sent to a peer that says ``Hello``."""
        if not 0 <= worker < len(endpoints):
            raise ValueError(f"worker {worker} is not in 0..{len(endpoints) - 1}")
        self.worker, self.workers = worker, len(endpoints)
        self._registers = registers
        self.joined: set[int] = set()
        """The peers that sent this worker their registers since it started."""
        self.endpoint = endpoints[worker]
        self.peer_endpoints = [ep for i, ep in enumerate(endpoints) if i != worker]
        self._apply = apply
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(PeerEvent).decode
        self._pub: zmq.Socket[bytes] | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._join_task: asyncio.Task[None] | None = None
        self.sent = 0
        self.applied = 0
        self.malformed = 0
        """Peer messages that did not decode (dropped)."""
        self.rejected = 0
        """Decoded peer events ``apply`` refused (an unknown model or engine; dropped)."""
        self.stale = 0
        """Engine events older than the change they would undo (dropped: a later one
        holds)."""
        self.skipped = 0
        """A join's messages for another worker (``State``, ``Synced``)."""

    async def start(self, ctx: zmq.asyncio.Context) -> None:
        """Bind this worker's PUB socket, connect to the peers' and start applying."""
        pub = zmq.Context.shadow(ctx.underlying).socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_PEER_MESSAGE_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._pub, self._sub = pub, sub
        try:
            pub.bind(self.endpoint)  # replaces a socket file a dead worker left
            for ep in self.peer_endpoints:  # ZeroMQ connects when the peer binds
                sub.connect(ep)
        except zmq.ZMQError as exc:
            await self.stop()
            raise ValueError(f"router workers' sync socket {self.endpoint}: {exc}") from None
        self._task = asyncio.create_task(self._run(sub), name="router peers")
        self._join_task = asyncio.create_task(self._join(), name="router peers join")

    async def stop(self) -> None:
        for task in (self._task, self._join_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._join_task = None
        for sock in (self._pub, self._sub):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._sub = None

    def publish(self, event: PeerEvent) -> None:
        """Send ``event`` to the peers; never blocks (dropped beyond the high-water mark)."""
        if self._pub is None:
            return
        with contextlib.suppress(zmq.Again):
            self._pub.send(self._encode(event), zmq.NOBLOCK)
            self.sent += 1

    async def _join(self) -> None:
        """Say ``Hello`` until every peer answered (``Synced``) or ``JOIN_TIMEOUT_S``."""
        loop = asyncio.get_running_loop()
        deadline, wait = loop.time() + JOIN_TIMEOUT_S, JOIN_FIRST_S
        while len(self.joined) < self.workers - 1 and loop.time() < deadline:
            self.publish(Hello(self.worker))
            await asyncio.sleep(wait)
            wait = min(2 * wait, JOIN_MAX_S)
        if len(self.joined) < self.workers - 1:
            log.warning("router worker %d: no state from worker(s) %s within %.0f s (down?); "
                        "it holds what it had", self.worker, ", ".join(
                            str(i) for i in range(self.workers)
                            if i != self.worker and i not in self.joined), JOIN_TIMEOUT_S)

    def _answer(self, worker: int) -> None:
        """Send ``worker`` (which said ``Hello``) every register held here."""
        for event in self._registers():
            self.publish(State(worker, event))
        self.publish(Synced(worker, self.worker))

    def feed(self, message: bytes) -> None:
        """Decode and apply one peer message; never raises for a bad one."""
        try:
            event = self._decode(message)
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
            self.malformed += 1
            return
        if isinstance(event, (State, Synced)) and event.to != self.worker:
            self.skipped += 1
            return
        if isinstance(event, (Hello, Synced)):
            peer = event.worker if isinstance(event, Hello) else event.peer
            if peer == self.worker or peer >= self.workers:
                self.rejected += 1
                return
            if isinstance(event, Hello):
                self._answer(peer)
            else:
                self.joined.add(peer)
            self.applied += 1
            return
        try:
            fresh = self._apply(event)
        except ValueError as exc:
            self.rejected += 1
            log.debug("peer event refused: %s", exc)
            return
        except Exception:  # a bug applying it: this message fails alone, the sync goes on
            self.rejected += 1
            log.exception("peer event %s could not be applied", type(event).__name__)
            return
        if fresh:
            self.applied += 1
        else:
            self.stale += 1

    async def _run(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            self.feed(await sub.recv())

