"""Engine telemetry: the scheduler-snapshot schema, its publisher, and decoders.

Importable without vLLM: the router uses the schema and the decoders of both streams
(our scheduler snapshots and vLLM's own KV cache events).

Wire format of a snapshot frame: ``[topic, seq (8-byte big-endian), msgpack payload]``,
the same framing vLLM's ``ZmqEventPublisher`` uses for KV events, so one subscriber
loop can read both.

Endpoint convention (shared with vLLM's KV event publisher): a publisher *binds*
``ipc://``/``inproc://`` endpoints and wildcard TCP endpoints, and *connects* to any
other TCP endpoint. The subscriber does the opposite (``subscriber_binds``).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

SCHEMA_VERSION = 1
"""Bumped on any incompatible change of ``SchedulerSnapshot``."""

DEFAULT_INTERVAL_S = 0.020
"""Minimum time between two snapshots while the engine is busy."""

DEFAULT_HEARTBEAT_S = 1.0
"""Maximum time between two snapshots while the engine is idle."""


class FinishedRequest(msgspec.Struct, array_like=True, frozen=True):
    """A request that finished since the previous snapshot."""

    request_id: str
    """Engine-side request id (vLLM appends ``-<8 hex>`` to the client's id)."""
    output_tokens: int
    reason: str
    """``stop``, ``length``, ``abort`` or ``error``."""


class SchedulerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """State of one engine's scheduler after a ``schedule()`` or output step."""

    version: int = SCHEMA_VERSION
    engine_id: str
    seq: int
    """Per-publisher sequence number, starting at 0, +1 per frame (gaps = loss)."""
    ts: float
    """Wall-clock time (``time.time()``) when the snapshot was taken."""
    step: int
    """Number of ``schedule()`` calls so far."""
    batch_size: int
    """Running requests."""
    num_waiting: int
    """Requests in the waiting queues (including preempted ones)."""
    queued_prefill_tokens: int
    """Prompt tokens not yet computed, over waiting and running requests."""
    pending_decode_tokens: int
    """Sum over running requests of ``max_tokens - generated``."""
    kv_usage: float
    """Fraction of KV cache blocks in use, 0..1."""
    num_preemptions: int
    """Preemptions since the engine started (cumulative)."""
    finished: list[FinishedRequest] = []
    heartbeat: bool = False
    """True when sent because the engine was idle for ``heartbeat_s``."""


# ---- vLLM KV cache events (mirror of vllm/distributed/kv_events.py, v0.32) ----


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
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
    """Per-stream counters kept by a decoder."""

    received: int = 0
    malformed: int = 0
    gaps: int = 0
    """Frames lost, from sequence-number jumps."""
    last_seq: int | None = None


@dataclass
class FrameDecoder:
    """Decodes ``[topic, seq, payload]`` frames of one kind, counting bad frames.

    ``decode`` returns ``(topic, seq, obj)`` or ``None`` for a malformed frame (wrong
    part count, bad sequence bytes, payload that does not match the schema, or a
    snapshot of another schema version). Sequence gaps are counted per topic.
    """

    kind: type
    stats: dict[str, StreamStats] = field(default_factory=dict)
    malformed: int = 0

    def __post_init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(self.kind)

    def decode(self, frames: list[bytes]) -> tuple[str, int, Any] | None:
        try:
            topic_b, seq_b, payload = frames
            if len(seq_b) != 8:
                raise ValueError("sequence field is not 8 bytes")
            topic = topic_b.decode("utf-8")
            seq = int.from_bytes(seq_b, "big", signed=True)
            obj = self._decoder.decode(payload)
            if isinstance(obj, SchedulerSnapshot) and obj.version != SCHEMA_VERSION:
                raise ValueError(f"schema version {obj.version} != {SCHEMA_VERSION}")
        except (ValueError, TypeError, msgspec.DecodeError, UnicodeDecodeError):
            self.malformed += 1
            return None
        st = self.stats.setdefault(topic, StreamStats())
        st.received += 1
        if st.last_seq is not None and seq > st.last_seq + 1:
            st.gaps += seq - st.last_seq - 1
        if st.last_seq is None or seq > st.last_seq or seq == 0:
            st.last_seq = seq
        return topic, seq, obj


def snapshot_decoder() -> FrameDecoder:
    return FrameDecoder(SchedulerSnapshot)


def kv_event_decoder() -> FrameDecoder:
    return FrameDecoder(KVEventBatch)


def encode_snapshot(snapshot: SchedulerSnapshot) -> bytes:
    return msgspec.msgpack.encode(snapshot)


# ---- publishing ----


class TelemetryPublisher:
    """Sends snapshots from a background thread; the engine step never blocks on I/O.

    The scheduler calls ``due()`` after each step and, only when a frame is due (the
    rate limit) or the engine just went idle, builds a snapshot and ``publish()``es it.
    Frames pass to the sender thread through a bounded queue; when it is full the frame
    is dropped and the sequence gap tells the router. While the engine is idle, the
    thread re-sends the last state as a heartbeat every ``heartbeat_s``.
    """

    def __init__(
        self,
        endpoint: str,
        topic: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        ctx: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
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
        return msgspec.structs.replace(
            last, seq=self.next_seq(), ts=time.time(), finished=[], heartbeat=True
        )

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)
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
                if snap is None:
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
