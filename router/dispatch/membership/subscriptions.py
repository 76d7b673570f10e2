"""``Subscriptions``: what the engines report, applied to the router state.

Scheduler snapshots and KV events come over ZeroMQ (``router.dispatch.subscriber``;
CURVE-authenticated when the cluster has keys: ``Membership`` owns the context and its
authenticator); stock vLLM engines (``kind = "vllm"``) publish no telemetry and are
scraped instead (``router.dispatch.scraper``), each scrape read as the snapshot it would
have published. Engines added and removed at run time are subscribed and unsubscribed here.
``Subscriptions`` is the router's ``TelemetrySink`` (``router.telemetry_source``): a source
given to the core in their place feeds the same decoders and state updates.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

import zmq.asyncio

from engine_ext.curve import router_curve
from engine_ext.telemetry import (KVEventBatch, SchedulerSnapshot, kv_event_decoder,
                                  snapshot_decoder)
from router.config.cluster import RouterConfig
from router.config.engines import EngineInstance
from router.dispatch.scraper import MetricsScraper
from router.dispatch.subscriber import StreamSubscriber
from router.state.cluster import ClusterState
from router.state.stats import RouterStats
from router.state.vllm_metrics import VllmMetrics, stock_snapshot

log = logging.getLogger("hetserve.router")

Unused = list[tuple[StreamSubscriber, str]]
"""Endpoints no engine uses any more, with the subscriber listening on each."""


class Subscriptions:
    """Telemetry and KV-event subscriptions and stock-engine scrapes, into the state (a
    ``TelemetrySink``)."""

    def __init__(self, r: RouterConfig, state: ClusterState,
                 instances: Iterable[EngineInstance], urls: dict[str, str],
                 clock: Callable[[], float]) -> None:
        """``urls``: each engine's base URL, kept current by ``EngineChanges`` (the
        scraper reads ``/metrics`` there)."""
        self.state, self.clock = state, clock
        instances = list(instances)
        self._names = {i.name for i in instances}
        """The decoders' topics, grown by ``add``."""
        self.curve = router_curve(r.telemetry_keys_dir) if r.telemetry_keys_dir else None
        self.snapshots = StreamSubscriber(
            "snapshot", [i.telemetry_endpoint for i in instances if i.telemetry_endpoint],
            snapshot_decoder(self._names), self._on_snapshot, self.curve)
        self.kv_events = StreamSubscriber(
            "kv", [i.kv_events_endpoint for i in instances if i.kv_events_endpoint],
            kv_event_decoder(self._names), self._on_kv_batch, self.curve)
        self.scraper = MetricsScraper(urls, self._on_scrape, r.scrape_interval_ms / 1e3,
                                      r.scrape_timeout_s)
        """Reads the stock vLLM engines at ``urls``."""
        self._ctx: zmq.asyncio.Context | None = None
        self._cleanup: set[asyncio.Task[None]] = set()
        """Unsubscribing from a removed engine's endpoints (a peer's removal)."""

    async def start(self, ctx: zmq.asyncio.Context, stock: list[str]) -> None:
        """Subscribe on ``ctx``; scrape the ``stock`` engines."""
        self._ctx = ctx
        await self.snapshots.start(ctx)
        await self.kv_events.start(ctx)
        await self.scraper.start(stock)

    async def stop(self) -> None:
        await self.scraper.stop()
        await self.snapshots.stop()
        await self.kv_events.stop()
        self._ctx = None

    def add(self, inst: EngineInstance) -> None:
        """Listen to an engine added at run time."""
        self._names.add(inst.name)
        if self._ctx is not None:
            if inst.telemetry_endpoint is not None:
                self.snapshots.add(inst.telemetry_endpoint)
            if inst.kv_events_endpoint is not None:
                self.kv_events.add(inst.kv_events_endpoint)
        if inst.kind == "vllm":
            self.scraper.add(inst.name)

    def remove(self, inst: EngineInstance, used: set[str | None]) -> Unused:
        """Stop reading a removed engine; its endpoints not in ``used`` (by the engines
        left), to ``unsubscribe``."""
        self._names.discard(inst.name)
        self.scraper.remove(inst.name)
        return [(sub, ep) for sub, ep in ((self.snapshots, inst.telemetry_endpoint),
                                          (self.kv_events, inst.kv_events_endpoint))
                if ep is not None and ep not in used]

    async def unsubscribe(self, unused: Unused, used: Callable[[], set[str | None]]) -> None:
        """Stop listening on ``unused`` endpoints, but for those an engine added since
        uses again (``used()``: the endpoints of the engines now routed to)."""
        for sub, ep in unused:
            if ep not in used():
                await sub.remove(ep)

    def unsubscribe_later(self, unused: Unused, used: Callable[[], set[str | None]]) -> None:
        """``unsubscribe`` in a task of its own (from a peer's change, applied in sync)."""
        if unused and self._ctx is not None:  # not started: nothing is subscribed
            self._cleanup.add(task := asyncio.get_running_loop().create_task(
                self.unsubscribe(unused, used)))
            task.add_done_callback(self._cleanup.discard)

    @property
    def stats(self) -> RouterStats:
        """Counters, with the subscribers' dropped-frame counts brought up to date."""
        st, snap, kv = self.state.stats, self.snapshots, self.kv_events
        st.malformed_snapshot_frames = snap.decoder.malformed
        st.malformed_kv_frames = kv.decoder.malformed
        st.unknown_topic_frames = snap.decoder.unknown_topic + kv.decoder.unknown_topic
        st.out_of_order_snapshot_frames = sum(
            s.out_of_order for s in snap.decoder.stats.values())
        st.out_of_order_kv_frames = sum(s.out_of_order for s in kv.decoder.stats.values())
        st.failed_snapshot_frames, st.failed_kv_frames = snap.errors, kv.errors
        return st

    def snapshot_frames(self, frames: list[bytes]) -> None:
        self.snapshots.feed(frames)

    def kv_event_frames(self, frames: list[bytes]) -> None:
        self.kv_events.feed(frames)

    def scraped(self, engine: str, seq: int, sent: float, reading: VllmMetrics) -> None:
        if engine in self.state.table.engines:
            self._apply_snapshot(stock_snapshot(engine, seq, sent, reading,
                                                self.state.ledger.load(engine)))

    # The decoders pass only well-formed frames of configured engines (a snapshot's
    # engine_id is its topic) that the sequence rule accepts (engine_ext.telemetry).

    def _on_snapshot(self, topic: str, seq: int, snap: SchedulerSnapshot) -> None:
        self._apply_snapshot(snap)
        counters, seqs = self.state.stats.engines[topic], self.snapshots.decoder.stats[topic]
        counters.snapshot_frames += 1
        counters.snapshot_gaps, counters.snapshot_resyncs = seqs.gaps, seqs.resyncs

    def _on_scrape(self, name: str, sent: float, reading: VllmMetrics) -> None:
        self.scraped(name, self.scraper.scrapes[name]["ok"], sent, reading)

    def _apply_snapshot(self, snap: SchedulerSnapshot) -> None:
        state, name = self.state, snap.engine_id
        if state.table.on_snapshot(snap, self.clock()):
            log.warning("engine %s is down: %s", name, state.table[name].down_reason)
            state.stats.engine_down_events += 1
        if snap.finished:
            state.ledger.finished(name, [f.request_id for f in snap.finished])
        state.ledger.mark_reported(name, snap.ts)

    def _on_kv_batch(self, topic: str, seq: int, batch: KVEventBatch) -> None:
        self.state.table.on_kv_batch(topic, seq, batch)
        counters, seqs = self.state.stats.engines[topic], self.kv_events.decoder.stats[topic]
        counters.kv_frames += 1
        counters.kv_gaps, counters.kv_resyncs = seqs.gaps, seqs.resyncs
