"""Router counters for /metrics and /health: telemetry, decisions, latencies."""

from __future__ import annotations

import bisect
from collections import Counter, deque
from dataclasses import dataclass, field

LATENCY_BUCKETS_S = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                     25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0)


@dataclass
class Histogram:
    """Cumulative-ready fixed-bucket histogram (Prometheus layout: le -> count)."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=4096))

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # last slot: +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1
        self.recent.append(value)


@dataclass
class StreamCounters:
    """Per-engine telemetry counters (staleness is ``EngineView.last_seen_age_s``)."""

    snapshot_frames: int = 0
    snapshot_gaps: int = 0
    snapshot_resyncs: int = 0
    """Times the snapshot sequence moved for good (``engine_ext.telemetry.StreamStats``)."""
    kv_frames: int = 0
    kv_gaps: int = 0
    kv_resyncs: int = 0


@dataclass
class RouterStats:
    engines: dict[str, StreamCounters] = field(default_factory=dict)
    malformed_snapshot_frames: int = 0
    malformed_kv_frames: int = 0
    unknown_topic_frames: int = 0
    """Well-formed frames whose topic is no configured instance (or, for a snapshot, not
    its engine_id)."""
    out_of_order_snapshot_frames: int = 0
    out_of_order_kv_frames: int = 0
    """Well-formed frames the sequence rule dropped (stale, duplicate, implausible jump)."""
    failed_snapshot_frames: int = 0
    failed_kv_frames: int = 0
    """Frames whose state update raised (skipped; the subscriber goes on)."""
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(policy, served model) -> decisions."""
    decision_latency_s: Histogram = field(default_factory=Histogram)
    """route() entry to decision, including predictors and batching windows."""
    predictor_latency_s: Histogram = field(default_factory=Histogram)
    """One batched predictor call."""
    engine_down_events: int = 0
    programs_expired: int = 0
    program_moves: Counter[str] = field(default_factory=Counter)
    """Calls of a program routed away from the engine its last call went to, by why:
    ``guardrail`` (its engine was overloaded, ``router.policies.affinity``), ``policy``
    (the policy chose another model or engine, or the engine was not a candidate)."""
    programs_found: Counter[str] = field(default_factory=Counter)
    """Calls by how admission found their program (``router.request.PROGRAM_SOURCES``)."""
    policy_sources: dict[str, str] = field(default_factory=dict)
    """Policy input -> ``predictor`` or ``static_prior``."""
