"""The twin's telemetry: the frames a real engine sends, stamped with the virtual clock.

An engine twin's scheduler (``engine_ext.instrumented.TelemetryMixin``) builds its
``SchedulerSnapshot``s itself and hands them to ``SnapshotFrames`` (its rate limit on the
virtual clock); vLLM's KV cache manager's events go to ``KVEventFrames``, which takes the
place of vLLM's ZeroMQ publisher. Both encode frames exactly as the engine's publishers do,
``[topic, 8-byte big-endian sequence number, msgpack payload]``, so the router's decoders
(``engine_ext.telemetry.snapshot_decoder`` / ``kv_event_decoder``) read them unchanged.
Frames wait in ``frames`` until the simulator hands them on.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from vllm.distributed.kv_events import EventBatch, EventPublisher

from engine_ext.telemetry import (DEFAULT_HEARTBEAT_S, DEFAULT_INTERVAL_S, SchedulerSnapshot,
                                  encode_snapshot, heartbeat_of)

Frame = tuple[bytes, bytes, bytes]
"""``(topic, seq, payload)`` as on the wire."""
Clock = Callable[[], float]


def frame(topic: str, seq: int, payload: bytes) -> Frame:
    return topic.encode("utf-8"), seq.to_bytes(8, "big"), payload


class SnapshotFrames:
    """A ``SnapshotSink`` on the virtual clock: the engine's rate limit, frames kept."""

    def __init__(self, topic: str, clock: Clock, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.topic = topic
        self.clock = clock
        self.interval_s = interval_s
        self.frames: list[Frame] = []
        self._seq = 0
        self._last_sent = float("-inf")
        self._last: SchedulerSnapshot | None = None

    def now(self) -> float:
        return self.clock()

    def due(self) -> bool:
        return self.clock() - self._last_sent >= self.interval_s

    def next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def publish(self, snapshot: SchedulerSnapshot) -> None:
        self._last_sent = self.clock()
        self._last = snapshot
        self.frames.append(frame(self.topic, snapshot.seq, encode_snapshot(snapshot)))

    def heartbeat(self, heartbeat_s: float = DEFAULT_HEARTBEAT_S) -> None:
        """An idle engine's heartbeat: its last state again when nothing was sent for
        ``heartbeat_s`` (``TelemetryPublisher``'s rule, on the virtual clock)."""
        if self._last is None or self.clock() - self._last_sent < heartbeat_s:
            return
        self._last_sent = self.clock()
        beat = heartbeat_of(self._last, self.next_seq(), self.clock())
        self.frames.append(frame(self.topic, beat.seq, encode_snapshot(beat)))

    def close(self) -> None:
        """Nothing to release."""


class KVEventFrames(EventPublisher):
    """vLLM's KV event publisher interface; batches restamped with the virtual clock."""

    def __init__(self, topic: str, clock: Clock) -> None:
        super().__init__()
        self.topic = topic
        self.clock = clock
        self.frames: list[Frame] = []
        self._seq = 0
        self._encoder = msgspec.msgpack.Encoder()

    def publish(self, events: EventBatch) -> None:
        events.ts = self.clock()
        if events.data_parallel_rank is None:
            events.data_parallel_rank = self._data_parallel_rank
        self.frames.append(frame(self.topic, self._seq, self._encoder.encode(events)))
        self._seq += 1

    def shutdown(self) -> None:
        """Nothing to release."""
