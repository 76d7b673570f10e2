"""The telemetry source: how what the engines report enters the router's state.

A ``TelemetrySource`` hands a ``TelemetrySink`` (``router.dispatch.membership``'s
``Subscriptions``) the messages of the engines' two streams, scheduler snapshots and KV
events, as their publishers encode them (``engine_ext.telemetry``: ``[topic, seq,
msgpack]``), and the readings of stock vLLM engines' ``/metrics``; the sink decodes,
checks and applies them. The live router's own source is ZeroMQ subscriptions and HTTP
scrapes (``Subscriptions.start``); the twin (``kernels_bench.lab.twin``) gives the core its
simulated engines' instead (``RouterCore(telemetry=...)``).
"""

from __future__ import annotations

from typing import Protocol

from router.state.vllm_metrics import VllmMetrics


class TelemetrySink(Protocol):
    """Where engine telemetry enters the router: decoded, checked (malformed, unknown and
    out-of-sequence messages counted and dropped), applied to the state."""

    def snapshot_frames(self, frames: list[bytes]) -> None:
        """One message of an engine's snapshot stream."""
        ...

    def kv_event_frames(self, frames: list[bytes]) -> None:
        """One message of an engine's KV-event stream."""
        ...

    def scraped(self, engine: str, seq: int, sent: float, reading: VllmMetrics) -> None:
        """A stock engine's ``/metrics`` reading (its ``seq``-th, taken at ``sent``), read
        as the snapshot it would have published."""
        ...


class TelemetrySource(Protocol):
    """Delivers the engines' telemetry to a sink from ``start`` to ``stop``."""

    async def start(self, sink: TelemetrySink) -> None:
        ...

    async def stop(self) -> None:
        ...
