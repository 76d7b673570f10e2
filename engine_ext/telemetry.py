"""Engine telemetry: the scheduler-snapshot schema, its publisher, and decoders.

Importable without vLLM: the router uses the schema and the decoders of both streams
(our scheduler snapshots and vLLM's own KV cache events).

Wire format of a snapshot frame: ``[topic, seq (8-byte big-endian), msgpack payload]``,
the same framing vLLM's ``ZmqEventPublisher`` uses for KV events, so one subscriber
loop can read both.

Endpoint convention (shared with vLLM's KV event publisher): a publisher *binds*
``ipc://``/``inproc://`` endpoints and wildcard TCP endpoints, and *connects* to any
other TCP endpoint. The subscriber does the opposite (``subscriber_binds``).

Decoding never trusts the bytes: ``FrameDecoder.decode`` is total (any frame gives a
result or ``None``, never an exception), the schemas bound every number the router reads
(a well-typed frame with a NaN or a negative count is malformed), and the sequence rule of
``StreamStats.accept`` keeps a single stale, duplicate or spoofed frame from moving a
stream's position.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Collection, Protocol, Sequence

import msgspec
import zmq

from engine_ext.curve import EngineCurve

SCHEMA_VERSION = 1
"""Bumped on any incompatible change of ``SchedulerSnapshot``."""

DEFAULT_INTERVAL_S = 0.020
"""Minimum time between two snapshots while the engine is busy."""

DEFAULT_HEARTBEAT_S = 0.5
"""Maximum time between two snapshots while the engine is idle (or in a long step): a
third of the router's default ``heartbeat_timeout_s``, so a stopped engine is routed
around within 2 s and a late heartbeat or two is no false alarm."""

SERVER_PID_ENV = "HETSERVE_SERVER_PID"
"""Set by ``engine_ext.serve`` to its own pid, inherited by vLLM's EngineCore process:
a publisher in a child of that process falls silent once the server is gone
(``server_pid``)."""

MAX_SEQ_JUMP = 1 << 20
"""Largest forward jump of a sequence number taken as lost frames: 5.8 hours of snapshots
at the default rate, more KV event batches than a subscribed router ever misses. A larger
jump is implausible (``StreamStats.accept``) and cannot count billions of gaps."""

Count = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
"""A count decoded from the wire: non-negative, at most 2**53 (exact as a float; no engine
holds 10^15 of anything), so no policy arithmetic meets a negative or an overflow."""

Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
"""Finite and non-negative (NaN fails every bound, infinity the upper one)."""

Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class FinishedRequest(msgspec.Struct, array_like=True, frozen=True):
    """A request that finished since the previous snapshot."""

    request_id: str
    """Engine-side request id (vLLM appends ``-<8 hex>`` to the client's id)."""
    output_tokens: Count
    reason: str
    """``stop``, ``length``, ``abort`` or ``error``."""


class SchedulerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """State of one engine's scheduler after a ``schedule()`` or output step.

    The bounds (``Count``, ``Timestamp``, ``Fraction``) are checked when decoding: a frame
    that breaks one is malformed, so no NaN or negative count reaches router state."""

    version: int = SCHEMA_VERSION
    engine_id: str
    """The engine id, also the frame's topic (a decoder drops a frame where they differ)."""
    seq: Count
    """Per-publisher sequence number, starting at 0, +1 per frame (gaps = loss)."""
    ts: Timestamp
    """Wall-clock time (``time.time()``) when the snapshot was taken."""
    step: Count
    """Number of ``schedule()`` calls so far."""
    batch_size: Count
    """Running requests."""
    num_waiting: Count
    """Requests in the waiting queues (including preempted ones)."""
    queued_prefill_tokens: Count
    """Prompt tokens not yet computed, over waiting and running requests."""
    pending_decode_tokens: Count
    """Sum over running requests of ``max_tokens - generated``."""
    kv_usage: Fraction
    """Fraction of KV cache blocks in use, 0..1."""
    num_preemptions: Count
    """Preemptions since the engine started (cumulative)."""
    finished: list[FinishedRequest] = []
    heartbeat: bool = False
    """True when sent because the engine was idle for ``heartbeat_s``."""


# ---- vLLM KV cache events (mirror of vllm/distributed/kv_events.py, v0.32) ----
# Same wire layout as vLLM's classes; the one bound added (block_size > 0) is on the one
# number the router computes with (a prompt's block hashes). ``extra_keys`` stays ``Any``
# as in vLLM, so a deeply nested one makes msgspec raise RecursionError: decode catches it.


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: Annotated[int, msgspec.Meta(gt=0)]
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


# ---- endpoints ----


def publisher_binds(endpoint: str) -> bool:
    """Whether the publishing side binds ``endpoint`` (vLLM's convention)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def subscriber_binds(endpoint: str) -> bool:
    """Whether the subscribing side binds ``endpoint``: the opposite of the publisher."""
    return not publisher_binds(endpoint)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ipc://, inproc:// and TCP endpoints on 127.0.0.0/8 or ::1."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


# ---- decoding (never trusts input) ----


@dataclass
class StreamStats:
    """One topic's position in its sequence, and its counters.

    The sequence rule (a publisher numbers its frames 0, 1, 2, ... and starts again at 0
    when it restarts), applied by ``accept``:

    - ``last < seq <= last + MAX_SEQ_JUMP``: in order; ``seq - last - 1`` frames were lost.
    - ``seq == 0`` after a later frame: the publisher restarted: accepted, a resync.
    - Anything else (a duplicate, a step back, a jump beyond ``MAX_SEQ_JUMP``) is
      implausible: the frame is dropped and its number kept as a candidate. If the next
      frame continues the candidate (``candidate < seq <= candidate + MAX_SEQ_JUMP``), the
      sender really moved there (a restart whose frame 0 was lost, a stream the router
      fell far behind, or recovery after a moved position): that frame is accepted, a
      resync. A frame that continues the old position clears the candidate.

    So one stale, duplicate or spoofed frame changes nothing and locks nothing out (the
    next real frame is accepted); only two consistent frames move the position.
    """

    received: int = 0
    """Frames accepted."""
    gaps: int = 0
    """Frames lost, from sequence-number jumps."""
    resyncs: int = 0
    """Times the position moved to a new sequence (restart or confirmed jump)."""
    out_of_order: int = 0
    """Frames dropped by the sequence rule."""
    last_seq: int | None = None
    candidate: int | None = None
    """Number of the last dropped frame, confirmed by a next frame that continues it."""

    def accept(self, seq: int) -> bool:
        """Apply the sequence rule to a well-formed frame numbered ``seq`` (>= 0)."""
        last, candidate = self.last_seq, self.candidate
        self.candidate = None
        if last is None or last < seq <= last + MAX_SEQ_JUMP:
            self.gaps += 0 if last is None else seq - last - 1
        elif 0 == seq < last or (candidate is not None
                                 and candidate < seq <= candidate + MAX_SEQ_JUMP):
            self.resyncs += 1
        else:
            self.candidate = seq
            self.out_of_order += 1
            return False
        self.last_seq = seq
        self.received += 1
        return True


@dataclass
class FrameDecoder:
    """Decodes ``[topic, seq, payload]`` frames of one kind, counting what it drops.

    ``decode`` returns ``(topic, seq, obj)``, or ``None`` for a frame it drops:

    - malformed (``malformed``, the error kept in ``last_error``): wrong part count, a
      sequence field that is not 8 bytes or is negative, a topic that is not UTF-8, a
      payload that does not match the schema or breaks its bounds, nesting too deep for
      the decoder, a snapshot of another schema version;
    - for no known engine (``unknown_topic``): a topic outside ``topics``, or a snapshot
      whose ``engine_id`` is not its topic;
    - out of sequence (``StreamStats.out_of_order`` of its topic): see ``StreamStats``.
    """

    kind: type
    topics: Collection[str] | None = None
    """Topics to accept (the router's engine ids); ``None``: any topic (per-topic state
    then grows with every topic seen, fine for a trusted single publisher)."""
    stats: dict[str, StreamStats] = field(default_factory=dict)
    malformed: int = 0
    unknown_topic: int = 0
    last_error: str | None = None
    """Why the last malformed frame was dropped."""

    def __post_init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(self.kind)

    def decode(self, frames: Sequence[bytes]) -> tuple[str, int, Any] | None:
        """Total: any list of byte strings gives a tuple or ``None``, never an exception."""
        try:
            topic, seq, obj = self._parse(frames)
        except Exception as exc:
            # Every Exception: msgspec's errors, RecursionError (a RuntimeError) from deep
            # nesting, MemoryError, whatever a future decoder raises. BaseException (task
            # cancellation, KeyboardInterrupt, SystemExit) is no frame's fault: it goes on.
            self.malformed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:200]
            return None
        if ((self.topics is not None and topic not in self.topics)
                or (isinstance(obj, SchedulerSnapshot) and obj.engine_id != topic)):
            self.unknown_topic += 1
            return None
        stats = self.stats.setdefault(topic, StreamStats())
        return (topic, seq, obj) if stats.accept(seq) else None

    def _parse(self, frames: Sequence[bytes]) -> tuple[str, int, Any]:
        topic_b, seq_b, payload = frames
        if len(seq_b) != 8:
            raise ValueError("sequence field is not 8 bytes")
        seq = int.from_bytes(seq_b, "big", signed=True)
        if seq < 0:
            raise ValueError(f"negative sequence number {seq}")
        obj = self._decoder.decode(payload)
        if isinstance(obj, SchedulerSnapshot) and obj.version != SCHEMA_VERSION:
            raise ValueError(f"schema version {obj.version} != {SCHEMA_VERSION}")
        return topic_b.decode("utf-8"), seq, obj


def snapshot_decoder(topics: Collection[str] | None = None) -> FrameDecoder:
    return FrameDecoder(SchedulerSnapshot, topics)


def kv_event_decoder(topics: Collection[str] | None = None) -> FrameDecoder:
    return FrameDecoder(KVEventBatch, topics)


def encode_snapshot(snapshot: SchedulerSnapshot) -> bytes:
    return msgspec.msgpack.encode(snapshot)


# ---- publishing ----


class SnapshotSink(Protocol):
    """Where an instrumented scheduler sends its snapshots: ``TelemetryPublisher`` in an
    engine, a virtual-clock sink in the twin (``kernels_bench.lab.twin``)."""

    def now(self) -> float:
        """The snapshot timestamp (``SchedulerSnapshot.ts``)."""
        ...

    def due(self) -> bool:
        """Whether the rate limit lets a snapshot go now."""
        ...

    def next_seq(self) -> int: ...

    def publish(self, snapshot: SchedulerSnapshot) -> None: ...

    def close(self) -> None: ...


def heartbeat_of(last: SchedulerSnapshot, seq: int, ts: float) -> SchedulerSnapshot:
    """The heartbeat an idle engine sends: its last state again, nothing finished."""
    return msgspec.structs.replace(last, seq=seq, ts=ts, finished=[], heartbeat=True)


def server_pid() -> int | None:
    """The pid of the API server whose EngineCore child this process is (``SERVER_PID_ENV``
    names this process's parent), else None (the engine runs in the server's process, or
    was not started by ``engine_ext.serve``)."""
    try:
        pid = int(os.environ.get(SERVER_PID_ENV, ""))
    except ValueError:
        return None
    return pid if pid == os.getppid() else None


class TelemetryPublisher:
    """Sends snapshots from a background thread; the engine step never blocks on I/O.

    The scheduler calls ``due()`` after each step and, only when a frame is due (the
    rate limit) or the engine just went idle, builds a snapshot and ``publish()``es it.
    Frames pass to the sender thread through a bounded queue; when it is full the frame
    is dropped and the sequence gap tells the router. While the engine is idle, the
    thread re-sends the last state as a heartbeat every ``heartbeat_s``.

    ``server_pid``: the API server this engine core serves. A killed server leaves its
    EngineCore running (vLLM's core does not watch its parent) until the launcher kills
    the tree; the core's heartbeats would keep a dead engine "up" at the router. So once
    this process's parent is no longer ``server_pid``, nothing more is sent and the
    router's heartbeat timeout routes around the engine.
    """

    def __init__(
        self,
        endpoint: str,
        topic: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        ctx: zmq.Context | None = None,
        curve: EngineCurve | None = None,
        server_pid: int | None = None,
    ) -> None:
        """``curve``: encrypt and authenticate to the router (``engine_ext.curve``)."""
        self.endpoint = endpoint
        self.server_pid = server_pid
        self.curve = curve
        self.topic = topic.encode("utf-8")
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self._ctx = ctx or zmq.Context.instance()
        self._queue: queue.Queue[SchedulerSnapshot | None] = queue.Queue(maxsize=256)
        self._last_sent = float("-inf")
        self._last: SchedulerSnapshot | None = None
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hetserve-telemetry", daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.time()

    def due(self) -> bool:
        return time.monotonic() - self._last_sent >= self.interval_s

    def next_seq(self) -> int:
        with self._lock:
            seq = self._seq
            self._seq += 1
            return seq

    def publish(self, snapshot: SchedulerSnapshot) -> None:
        """Hand one snapshot (numbered with ``next_seq()``) to the sender thread."""
        self._last_sent = time.monotonic()
        self._last = snapshot
        try:
            self._queue.put_nowait(snapshot)
        except queue.Full:
            pass

    def _heartbeat(self) -> SchedulerSnapshot | None:
        last = self._last
        if last is None or time.monotonic() - self._last_sent < self.heartbeat_s:
            return None
        self._last_sent = time.monotonic()
        return heartbeat_of(last, self.next_seq(), time.time())

    def orphaned(self) -> bool:
        """Whether the API server this engine core served is gone."""
        return self.server_pid is not None and os.getppid() != self.server_pid

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        if self.curve is not None:
            self.curve.apply(sock)
        if publisher_binds(self.endpoint):
            sock.bind(self.endpoint)
        else:
            sock.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                try:
                    snap: SchedulerSnapshot | None = self._queue.get(timeout=self.heartbeat_s / 4)
                except queue.Empty:
                    snap = self._heartbeat()
                if snap is None or self.orphaned():
                    continue
                frames = (self.topic, snap.seq.to_bytes(8, "big", signed=True), encode_snapshot(snap))
                try:
                    sock.send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        """Stop the sender thread (woken at once) and close its socket."""
        self._stop.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread is busy draining and will see the stop flag
        self._thread.join(timeout=2)
