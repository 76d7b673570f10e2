"""Prometheus metrics of the router (one registry per app).

The front counts what only it sees (HTTP requests, upstream errors, tokenization time).
Everything the core keeps (engine table, in-flight accounting, telemetry counters,
decisions and their latencies, ``Membership.stats``) is read at scrape time by a
collector, so there is one source of truth for each number.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Iterator

from prometheus_client import (CollectorRegistry, Counter, Histogram, ProcessCollector,
                               generate_latest)
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

from router.dispatch.scraper import FAILURES
from router.request import PROGRAM_SOURCES

if TYPE_CHECKING:
    from router.dispatch.core import RouterCore
    from router.state.stats import Histogram as CoreHistogram

TOKENIZE_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                      2.5e-2, 5e-2, 0.1)

_ENGINE_GAUGES = (
    ("up", "1 if the router routes to the engine, else 0"),
    ("batch_size", "running requests in the last telemetry snapshot"),
    ("num_waiting", "waiting requests in the last telemetry snapshot"),
    ("queued_prefill_tokens", "prompt tokens not yet computed (last snapshot)"),
    ("pending_decode_tokens", "decode tokens still to generate (last snapshot)"),
    ("kv_usage", "fraction of KV cache blocks in use (last snapshot)"),
    ("inflight_requests", "requests the router has in flight on the engine"),
    ("inflight_predicted_tokens", "predicted tokens of the router's in-flight requests"),
)


def _histogram(name: str, doc: str, labels: list[str], values: list[str],
               hist: CoreHistogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    bounds = [repr(float(b)) for b in hist.buckets] + ["+Inf"]
    cumulative = list(itertools.accumulate(hist.counts))
    family.add_metric(values, list(zip(bounds, cumulative)), hist.sum)
    return family


def _tasks() -> int:
    """Tasks of the running event loop (scrapes run on it); 0 off the loop."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


class _CoreCollector(Collector):
    """The core's engine table and counters, read at scrape time."""

    def __init__(self, core: RouterCore, policy: str) -> None:
        self._core, self._policy = core, policy

    def collect(self) -> Iterator[Metric]:
        yield from self._engines()
        yield from self._telemetry()
        stats = self._core.membership.stats
        decisions = CounterMetricFamily("hetserve_decisions", "routing decisions by policy "
                                        "and model", labels=["policy", "model"])
        for (policy, model), n in sorted(stats.decisions.items()):
            decisions.add_metric([policy, model], n)
        yield decisions
        yield _histogram("hetserve_decision_latency_seconds", "route() entry to decision, "
                         "including predictors and batching windows", ["policy"],
                         [self._policy], stats.decision_latency_s)
        yield _histogram("hetserve_predictor_latency_seconds", "one batched predictor call",
                         [], [], stats.predictor_latency_s)
        yield CounterMetricFamily("hetserve_engine_down_events", "times an engine went down",
                                  value=stats.engine_down_events)
        yield CounterMetricFamily("hetserve_programs_expired", "workflow programs dropped "
                                  "after the TTL", value=stats.programs_expired)
        moves = CounterMetricFamily("hetserve_program_moves", "calls of a program routed "
                                    "away from the engine its last call went to (guardrail: "
                                    "that engine was overloaded; policy: the policy chose "
                                    "another, or it was not a candidate)", labels=["reason"])
        for reason in ("guardrail", "policy"):
            moves.add_metric([reason], stats.program_moves[reason])
        yield moves
        found = CounterMetricFamily(
            "hetserve_programs_found", "calls by how their program was found (workflow: "
            "hetserve's own id; agentic_context, session, prompt_cache_key, "
            "metadata_user_id: a client convention; previous_response: the Responses "
            "chain; conversation: the call extends an earlier call's conversation; new: "
            "a new program; none: no program)", labels=["source"])
        for source in PROGRAM_SOURCES:
            found.add_metric([source], stats.programs_found[source])
        yield found
        yield GaugeMetricFamily("hetserve_programs", "workflow programs in the program "
                                "table (running, or waiting for their next stage)",
                                value=len(self._core.state.programs))
        yield GaugeMetricFamily("hetserve_inflight_ledger_entries", "requests in the "
                                "router's in-flight ledger (every engine)",
                                value=len(self._core.state.ledger))
        yield GaugeMetricFamily("hetserve_open_requests", "requests the router has open on "
                                "engines (every engine)",
                                value=sum(self._core.state.open_requests.values()))
        yield GaugeMetricFamily("hetserve_asyncio_tasks", "asyncio tasks of the router's "
                                "event loop (0 when scraped off the loop)",
                                value=_tasks())
        peers = self._core.membership.peers
        if peers is not None:
            events = CounterMetricFamily("hetserve_peer_events", "program-table and engine-"
                                         "mark changes among router workers (sent; applied, "
                                         "malformed, rejected, stale or skipped as received; "
                                         "stale: older than the change it would undo, "
                                         "dropped; skipped: a joining worker's state meant "
                                         "for another)", labels=["outcome"])
            for outcome in ("sent", "applied", "malformed", "rejected", "stale", "skipped"):
                events.add_metric([outcome], getattr(peers, outcome))
            yield events

    def _engines(self) -> Iterator[Metric]:
        labels = ["engine", "model"]
        families = {name: GaugeMetricFamily(f"hetserve_engine_{name}", doc, labels=labels)
                    for name, doc in _ENGINE_GAUGES}
        staleness = GaugeMetricFamily(
            "hetserve_telemetry_staleness_seconds", "seconds since the engine's last "
            "telemetry snapshot (absent before the first one)", labels=labels)
        info = GaugeMetricFamily("hetserve_engine_info", "1 per engine: where it runs (its "
                                 "URL; its Ray node when the launcher placed it on one) and "
                                 "its kind (hetserve: patched, its telemetry published; "
                                 "vllm: stock, its /metrics scraped)",
                                 labels=["engine", "model", "url", "node", "kind"])
        membership = self._core.membership
        scrapes = CounterMetricFamily("hetserve_scrapes", "/metrics scrapes of stock vLLM "
                                      "engines by outcome (ok, or why one failed: "
                                      + ", ".join(FAILURES) + ")",
                                      labels=["engine", "outcome"])
        down_at = GaugeMetricFamily("hetserve_engine_down_timestamp_seconds", "Unix time "
                                    "the engine last went from up to down (absent if it "
                                    "never did)", labels=labels)
        sent = GaugeMetricFamily("hetserve_telemetry_sent_timestamp_seconds", "Unix time "
                                 "on the engine's last telemetry snapshot, by the engine's "
                                 "clock (a stock engine's: when its scrape was sent; absent "
                                 "before the first)", labels=labels)
        received = GaugeMetricFamily("hetserve_telemetry_received_timestamp_seconds", "Unix "
                                     "time the router received the engine's last telemetry "
                                     "snapshot (absent before the first)", labels=labels)
        kv_blocks = GaugeMetricFamily("hetserve_engine_kv_index_blocks", "blocks in the "
                                      "router's index of the engine's prefix cache (from its "
                                      "KV events)", labels=labels)
        for view in membership.engines():
            values = [view.name, view.model]
            state = self._core.state.table[view.name]
            kv_blocks.add_metric(values, len(state.kv))
            if state.down_at is not None:
                down_at.add_metric(values, state.down_at)
            if state.snapshot is not None and state.received_at is not None:
                sent.add_metric(values, state.snapshot.ts)
                received.add_metric(values, state.received_at)
            info.add_metric([*values, state.url,
                             membership.nodes.get(view.name) or "",
                             membership.instances[view.name].kind], 1.0)
            counts = membership.scraper.scrapes.get(view.name)
            for outcome in ("ok", *FAILURES) if counts is not None else ():
                scrapes.add_metric([view.name, outcome], counts[outcome])
            for name, family in families.items():
                family.add_metric(values, float(getattr(view, name)))
            if view.last_seen_age_s is not None:
                staleness.add_metric(values, view.last_seen_age_s)
        yield from families.values()
        yield staleness
        yield info
        yield scrapes
        yield kv_blocks
        yield down_at
        yield sent
        yield received

    def _telemetry(self) -> Iterator[Metric]:
        stats = self._core.membership.stats
        frames = CounterMetricFamily("hetserve_telemetry_frames", "telemetry frames received",
                                     labels=["engine", "stream"])
        lost = CounterMetricFamily("hetserve_telemetry_lost_frames", "frames lost in transit "
                                   "(sequence gaps)", labels=["engine", "stream"])
        resyncs = CounterMetricFamily("hetserve_telemetry_resyncs", "times a stream's "
                                      "sequence moved for good (publisher restart, or a "
                                      "confirmed jump)", labels=["engine", "stream"])
        for name, c in sorted(stats.engines.items()):
            frames.add_metric([name, "snapshot"], c.snapshot_frames)
            frames.add_metric([name, "kv"], c.kv_frames)
            lost.add_metric([name, "snapshot"], c.snapshot_gaps)
            lost.add_metric([name, "kv"], c.kv_gaps)
            resyncs.add_metric([name, "snapshot"], c.snapshot_resyncs)
            resyncs.add_metric([name, "kv"], c.kv_resyncs)
        dropped = CounterMetricFamily("hetserve_telemetry_dropped_frames", "frames dropped "
                                      "by the router (malformed: undecodable or out of "
                                      "bounds; out_of_order: rejected by the sequence rule; "
                                      "error: the state update raised)",
                                      labels=["stream", "reason"])
        for stream, malformed, out_of_order, error in (
                ("snapshot", stats.malformed_snapshot_frames,
                 stats.out_of_order_snapshot_frames, stats.failed_snapshot_frames),
                ("kv", stats.malformed_kv_frames, stats.out_of_order_kv_frames,
                 stats.failed_kv_frames)):
            dropped.add_metric([stream, "malformed"], malformed)
            dropped.add_metric([stream, "out_of_order"], out_of_order)
            dropped.add_metric([stream, "error"], error)
        dropped.add_metric(["any", "unknown_topic"], stats.unknown_topic_frames)
        yield from (frames, lost, resyncs, dropped)


class RouterMetrics:
    """Every metric the router exports."""

    def __init__(self, core: RouterCore, policy: str) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter("hetserve_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=reg)
        self.tokenize_latency = Histogram(
            "hetserve_tokenize_latency_seconds", "time spent tokenizing prompts",
            buckets=TOKENIZE_BUCKETS_S, registry=reg)
        self.upstream_errors = Counter(
            "hetserve_upstream_errors", "failed engine calls by engine and kind "
            "(connect, timeout, protocol, status)", ["engine", "kind"], registry=reg)
        self.redispatched = Counter(
            "hetserve_redispatched", "requests routed again after their engine sent no byte "
            "of an answer (unreachable, or closed the connection)", registry=reg)
        self.untrusted_fields = Counter(
            "hetserve_untrusted_fields_ignored", "ranking fields (workflow position, "
            "client priority) an untrusted API key sent, dropped", ["field"], registry=reg)
        reg.register(_CoreCollector(core, policy))
        ProcessCollector(registry=reg)  # process_resident_memory_bytes, _open_fds, ...

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
