"""``Membership``: which engines the router routes to, and what it hears from them.

It subscribes to every engine's telemetry and KV events (CURVE-authenticated when the
cluster has keys), scrapes the ``/metrics`` of stock vLLM engines instead of their
telemetry (``router.dispatch.scraper``), probes engines a failed call marked down,
applies the launcher's and operators' verdicts (down, up, move, add, remove) and shares
them, and the program table's changes, with the other router workers
(``router.dispatch.peers``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable
from urllib.parse import urlsplit

import msgspec
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from engine_ext.curve import router_curve
from engine_ext.telemetry import (KVEventBatch, SchedulerSnapshot, kv_event_decoder,
                                  snapshot_decoder)
from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import EngineInstance, MAX_NODE_CHARS
from router.config.membership import with_engine, without_engine
from router.dispatch.health_probe import HealthProber
from router.dispatch.peers import (MAX_ENTRY_CHARS, MAX_URL_CHARS, Added, Completed,
                                   EngineEvent, Marked, Moved, PeerEvent, Peers, Removed,
                                   Routed, State, sync_endpoints)
from router.dispatch.scraper import MetricsScraper
from router.dispatch.subscriber import StreamSubscriber
from router.policies.base import Policy
from router.state.cluster import ClusterState
from router.state.engine_versions import ORIGIN, EngineVersions, Version
from router.state.stats import RouterStats, StreamCounters
from router.state.view import EngineView, engine_view
from router.state.vllm_metrics import VllmMetrics, stock_snapshot

log = logging.getLogger("hetserve.router")
SWEEPS_PER_TIMEOUT = 10
"""How often per ``heartbeat_timeout_s`` a worker applies the timeouts without being asked
(``Membership._sweep``): while the event loop runs, a silent engine goes down at most a
tenth of a timeout late."""


class Membership:
    """The engines routed to: telemetry subscriptions, health, admin verdicts, peers."""

    def __init__(self, config: ClusterConfig, state: ClusterState,
                 clock: Callable[[], float] = time.monotonic, worker: int | None = None) -> None:
        """``worker``: this process's index among ``config.router.workers`` router
        processes serving one port (``router.dispatch.peers``); None for a lone router."""
        r = config.router
        self.config, self.state, self.clock = config, state, clock
        instances = config.instances()
        self.instances: dict[str, EngineInstance] = {i.name: i for i in instances}
        """The engine instances routed to (``config.instances()``, plus added ones)."""
        self._first: dict[str, str] = {}
        """Each served model's first engine in the file: the one an engine added to a
        model left without any is like (``Policy.add_engine``)."""
        for i in instances:
            self._first.setdefault(i.served_model_name, i.name)
        self._models = {e.served_model_name: e.model for e in config.engines}
        """The model each served name was started with (``with_engine``'s ``models``)."""
        self.nodes: dict[str, str | None] = {i.name: i.node for i in instances}
        """Where each engine runs, when the launcher placed it on a Ray node; such an
        engine may move to another host (``move_engine``)."""
        self.policy: Policy[Any] | None = None
        """The routing policy, told of engines added and removed (``RouterCore`` sets it)."""
        names = set(self.instances)  # the decoders' topics, grown by add_engine
        self._names = names
        self.curve = router_curve(r.telemetry_keys_dir) if r.telemetry_keys_dir else None
        self.snapshots = StreamSubscriber(
            "snapshot", [i.telemetry_endpoint for i in instances if i.telemetry_endpoint],
            snapshot_decoder(names), self._on_snapshot, self.curve)
        self.kv_events = StreamSubscriber(
            "kv", [i.kv_events_endpoint for i in instances if i.kv_events_endpoint],
            kv_event_decoder(names), self._on_kv_batch, self.curve)
        self.prober = HealthProber({i.name: i.url for i in instances},
                                   lambda name: self.mark_engine(name, True, "health probe"),
                                   backoff_s=r.breaker_backoff_s,
                                   backoff_max_s=r.breaker_backoff_max_s)
        self.scraper = MetricsScraper(self.prober.urls, self._on_scrape,
                                      r.scrape_interval_ms / 1e3, r.scrape_timeout_s)
        """Reads the stock vLLM engines (``kind = "vllm"``) at the prober's URLs."""
        self.worker = worker
        self.versions = EngineVersions(self.instances, worker or 0)
        """The admin changes' order across router workers (``router.state.engine_versions``)."""
        self.peers = _peers(r, worker, self._apply_peer, self._registers)
        self._cleanup: set[asyncio.Task[None]] = set()
        """Unsubscribing from a removed engine's endpoints (a peer's removal)."""
        self._zap: AsyncioAuthenticator | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe to every engine's telemetry and KV events, link the peers, probe."""
        self._ctx = zmq.asyncio.Context()
        if self.curve is not None:  # ZAP: only the engines' key gets a connection
            self._zap = AsyncioAuthenticator(self._ctx, log=log)
            self._zap.start()
            self._zap.configure_curve_callback("*", self.curve)
        try:
            await self.snapshots.start(self._ctx)
            await self.kv_events.start(self._ctx)
            await self.scraper.start([i.name for i in self.instances.values()
                                      if i.kind == "vllm"])
            if self.peers is not None:
                await self.peers.start(self._ctx)
        except ValueError:
            await self.stop()
            raise
        await self.prober.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="hetserve liveness sweep")

    async def _sweep(self) -> None:
        """Apply the heartbeat timeouts every tenth of one, so that a silent engine goes
        down on time also while no decision or ``engines()`` call of this worker applies
        them (a worker whose clients all wait on that engine)."""
        while True:
            await asyncio.sleep(self.state.table.heartbeat_timeout_s / SWEEPS_PER_TIMEOUT)
            self.state.mark_silent(self.clock())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        await self.prober.stop()
        await self.scraper.stop()
        await self.snapshots.stop()
        await self.kv_events.stop()
        if self.peers is not None:
            await self.peers.stop()
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # ---- marks and moves ----

    def mark_engine(self, instance: str, up: bool, reason: str, probe: bool = False) -> None:
        """Mark an engine down or back up. ``probe=True`` (a failed HTTP call): the
        health prober marks it up once it answers ``/health``; otherwise (launcher,
        operator) only an explicit mark brings it back."""
        state = self.state
        if instance not in state.table.engines:
            raise ValueError(f"unknown instance '{instance}'")
        if up or not probe:
            self.prober.forget(instance)
        else:
            self.prober.watch(instance)
        if state.table.mark(instance, up, reason):
            state.stats.engine_down_events += 1
        if not up:
            state.ledger.release_engine(instance)

    def admin_mark(self, instance: str, up: bool, reason: str) -> Version:
        """The launcher's or an operator's verdict on an engine: applied here and sent to
        the other router workers (ValueError: an unknown instance); its version."""
        self.mark_engine(instance, up, reason)
        version = self.versions.stamp(instance)
        self.versions.marked(instance, version, up, reason)
        if self.peers is not None:
            self.peers.publish(Marked(instance, version, up, reason))
        return version

    def admin_move(self, instance: str, url: str, node: str | None = None) -> Version:
        """The launcher restarted ``instance`` on another port (same host; any host for an
        engine it placed on a Ray node): route to ``url`` from now on, here and in the
        other router workers (ValueError: an unknown instance, or a URL that is not
        ``http://<the same host>:PORT``). ``node``: its new Ray node. Its version."""
        self.move_engine(instance, url, node)
        version = self.versions.stamp(instance)
        url, node = self.state.table[instance].url, self.nodes.get(instance)
        self.versions.moved(instance, version, url, node)
        if self.peers is not None:
            self.peers.publish(Moved(instance, version, url, node))
        return version

    def move_engine(self, instance: str, url: str, node: str | None = None) -> None:
        table = self.state.table
        if instance not in table.engines:
            raise ValueError(f"unknown instance '{instance}'")
        old, new = urlsplit(table[instance].url), urlsplit(url)
        try:
            port = new.port
        except ValueError:
            port = None
        placed = self.nodes.get(instance) is not None
        if len(url) > MAX_URL_CHARS or (node is not None and len(node) > MAX_NODE_CHARS):
            raise ValueError(f"url (at most {MAX_URL_CHARS} characters) or node (at most "
                             f"{MAX_NODE_CHARS}) too long")
        if (new.scheme != "http" or not new.hostname or port is None
                or (new.hostname != old.hostname and not placed)
                or new.path.strip("/") or new.query or new.username or new.password):
            rule = ("http://HOST:PORT" if placed else f"http://{old.hostname}:PORT (the "
                    "engine's host; only its port may change)")
            raise ValueError(f"url must be {rule}, got {url[:200]!r}")
        if node is not None and not placed:
            raise ValueError(f"engine '{instance}' was not placed on a Ray node: no node")
        table[instance].url = self.prober.urls[instance] = url.rstrip("/")
        if node is not None:
            self.nodes[instance] = node
        log.warning("engine %s moved to %s%s", instance, url, f" on {node}" if node else "")

    # ---- engines added and removed ----

    def admin_add(self, entry: dict[str, Any]) -> tuple[EngineInstance, Version]:
        """The launcher started one more replica of a served model: validate its
        cluster-file ``entry`` (``router.config.with_engine``; ConfigError, a ValueError)
        and route to it, here and in the other router workers; the new instance and the
        add's version."""
        text = msgspec.json.encode(entry).decode()
        if len(text) > MAX_ENTRY_CHARS:  # the other workers could not take it
            raise ValueError(f"the entry is over {MAX_ENTRY_CHARS} characters as JSON")
        inst = self._add(entry)
        version = self.versions.stamp(inst.name)
        self.versions.added(inst.name, version, text)
        if self.peers is not None:
            self.peers.publish(Added(inst.name, version, text))
        return inst, version

    def _add(self, entry: dict[str, Any]) -> EngineInstance:
        state = self.state
        self.config = with_engine(self.config, entry, state.table.served, self._models)
        inst = next(i for i in self.config.instances() if i.name == entry["name"])
        model = inst.served_model_name
        engines = state.table.models.get(model)
        like = engines[0].name if engines else self._first[model]
        state.table.add(inst)
        self.instances[inst.name] = inst
        self._names.add(inst.name)
        state.stats.engines.setdefault(inst.name, StreamCounters())
        self.nodes[inst.name] = inst.node
        self.prober.urls[inst.name] = inst.url
        if self._ctx is not None:
            if inst.telemetry_endpoint is not None:
                self.snapshots.add(inst.telemetry_endpoint)
            if inst.kv_events_endpoint is not None:
                self.kv_events.add(inst.kv_events_endpoint)
        if inst.kind == "vllm":
            self.scraper.add(inst.name)
        if self.policy is not None:
            self.policy.add_engine(inst.name, model, like)
        log.warning("engine %s added (%s at %s)", inst.name, model, inst.url)
        return inst

    async def admin_remove(self, instance: str) -> Version:
        """The launcher drained ``instance`` (marked down, nothing in flight) and stops
        it: forget it here and in the other router workers (ValueError: not marked down,
        requests still in flight, or not removable: ``without_engine``); its version."""
        unused = self._remove(instance)
        version = self.versions.stamp(instance)
        self.versions.removed(instance, version)
        if self.peers is not None:
            self.peers.publish(Removed(instance, version))
        await self._unsubscribe(unused)
        return version

    def _remove(self, instance: str, drained: bool = True) -> list[tuple[StreamSubscriber, str]]:
        """Forget ``instance``; the endpoints no other engine uses, to unsubscribe.
        ``drained``: only if marked down with nothing in flight here and not the last
        engine of its model (an admin call); a peer's removal, already ordered after the
        calls it won over, is applied as is, also when it leaves its model without an
        engine (requests for it then get a 503 until an engine of it is added)."""
        state = self.state
        e = state.table.engines.get(instance)
        if e is None:
            raise ValueError(f"unknown instance '{instance}'")
        if drained and e.marked_down is None:
            raise ValueError(f"mark '{instance}' down first (POST .../down), then remove it "
                             "once nothing is in flight")
        inflight = state.open_requests[instance]
        if drained and inflight:
            raise ValueError(f"'{instance}' still has {inflight} request(s) in flight")
        self.config = without_engine(self.config, instance, last=not drained)
        inst = self.instances.pop(instance)
        state.table.remove(instance)
        self._names.discard(instance)
        self.nodes.pop(instance, None)
        self.prober.urls.pop(instance, None)
        self.prober.forget(instance)
        self.scraper.remove(instance)
        if self.policy is not None:
            self.policy.remove_engine(instance)
        log.warning("engine %s removed", instance)
        used = self._endpoints()
        return [(sub, ep) for sub, ep in ((self.snapshots, inst.telemetry_endpoint),
                                          (self.kv_events, inst.kv_events_endpoint))
                if ep is not None and ep not in used]

    def _endpoints(self) -> set[str | None]:
        return {ep for i in self.instances.values()
                for ep in (i.telemetry_endpoint, i.kv_events_endpoint)}

    async def _unsubscribe(self, unused: list[tuple[StreamSubscriber, str]]) -> None:
        """Stop listening on ``unused`` endpoints, but for those an engine added since
        uses again."""
        for sub, ep in unused:
            if ep not in self._endpoints():
                await sub.remove(ep)

    def _unsubscribe_later(self, unused: list[tuple[StreamSubscriber, str]]) -> None:
        if unused and self._ctx is not None:  # not started: nothing is subscribed
            self._cleanup.add(task := asyncio.get_running_loop().create_task(
                self._unsubscribe(unused)))
            task.add_done_callback(self._cleanup.discard)

    def _apply_peer(self, event: PeerEvent) -> bool:
        """A change another router worker made: False if a later change holds (dropped;
        ValueError: one naming what is not here)."""
        now, programs = self.clock(), self.state.programs
        if isinstance(event, Routed):
            if not any(e.model == event.model for e in self.state.table.engines.values()):
                raise ValueError(f"unknown model {event.model!r}")
            programs.routed(event.program_id, event.model, now)
        elif isinstance(event, Completed):
            programs.completed(event.program_id, event.final, event.error, now)
        elif isinstance(event, State):
            return self._apply_engine(event.event, joined=True)
        elif isinstance(event, (Marked, Moved, Added, Removed)):
            return self._apply_engine(event)
        else:  # Hello, Synced: the link's own (``Peers.feed``)
            raise ValueError(f"a {type(event).__name__} is not a change")
        return True

    def _registers(self) -> list[EngineEvent]:
        """Every versioned register held here, as the events that set them (for a worker
        that joins: ``Peers``)."""
        out: list[EngineEvent] = []
        for name, rec in self.versions.records.items():
            if rec.life != ORIGIN:
                out.append(Added(name, rec.life, rec.entry) if rec.present and rec.entry
                           else Removed(name, rec.life))
            if rec.mark is not None:
                out.append(Marked(name, rec.mark.version, rec.mark.up, rec.mark.reason))
            if rec.place is not None:
                out.append(Moved(name, rec.place.version, rec.place.url, rec.place.node))
        return out

    def _apply_engine(self, event: EngineEvent, joined: bool = False) -> bool:
        """A peer's admin change, applied if its version is above the one held for what
        it sets (``router.state.engine_versions``); False if not. ``joined``: one of a
        peer's registers sent to this worker as it joined, which may be this worker's own
        change from before it restarted."""
        name, version, versions = event.instance, event.version, self.versions
        if version.worker >= self.config.router.workers or (version.worker == self.worker
                                                            and not joined):
            raise ValueError(f"version {version} is not of a peer worker")
        entry = msgspec.json.decode(event.entry) if isinstance(event, Added) else {}
        if not isinstance(entry, dict) or (isinstance(event, Added)
                                           and entry.get("name") != name):
            raise ValueError(f"an added engine's entry must be a JSON object named {name!r}")
        field = ("life" if isinstance(event, (Added, Removed)) else
                 "mark" if isinstance(event, Marked) else "place")
        if not versions.newer(name, field, version):
            return False
        if isinstance(event, Marked):
            if name not in self.instances:  # kept for its add, should that come later
                versions.marked(name, version, event.up, event.reason)
                raise ValueError(f"unknown instance '{name}'")
            self.mark_engine(name, event.up, event.reason)
            versions.marked(name, version, event.up, event.reason)
        elif isinstance(event, Moved):
            if name not in self.instances:
                versions.moved(name, version, event.url, event.node)
                raise ValueError(f"unknown instance '{name}'")
            self.move_engine(name, event.url, event.node)
            versions.moved(name, version, event.url, event.node)
        elif isinstance(event, Removed):
            if name in self.instances:
                self._unsubscribe_later(self._remove(name, drained=False))
            versions.removed(name, version)
        else:
            self._put(entry, version, event.entry)
        return True

    def _put(self, entry: dict[str, Any], version: Version, text: str) -> None:
        """A peer's add of ``entry`` that holds (over an engine of that name here too:
        two adds at once): the engine as the entry has it, with the marks and moves that
        came before their add (from a third worker) but are newer."""
        name = entry["name"]
        if name in self.instances:
            with_engine(without_engine(self.config, name, last=True), entry,
                        self.state.table.served, self._models)  # refused as a whole
            self._unsubscribe_later(self._remove(name, drained=False))
        self._add(entry)
        self.versions.added(name, version, text)
        if (mark := self.versions.mark(name)) is not None:
            self.mark_engine(name, mark.up, mark.reason)
        if (place := self.versions.place(name)) is not None:
            self.move_engine(name, place.url, place.node)

    # ---- what the engines report ----

    def engines(self) -> list[EngineView]:
        now = self.clock()
        self.state.maintain(now)
        return [engine_view(e, self.state.ledger, now) for e in self.state.table.engines.values()]

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

    # The decoders pass only well-formed frames of configured engines (a snapshot's
    # engine_id is its topic) that the sequence rule accepts (engine_ext.telemetry).

    def _on_snapshot(self, topic: str, seq: int, snap: SchedulerSnapshot) -> None:
        self._apply_snapshot(snap)
        counters, seqs = self.state.stats.engines[topic], self.snapshots.decoder.stats[topic]
        counters.snapshot_frames += 1
        counters.snapshot_gaps, counters.snapshot_resyncs = seqs.gaps, seqs.resyncs

    def _on_scrape(self, name: str, sent: float, reading: VllmMetrics) -> None:
        """A stock engine's ``/metrics``, as the snapshot it would have published."""
        if name in self.state.table.engines:
            self._apply_snapshot(stock_snapshot(name, self.scraper.scrapes[name]["ok"], sent,
                                                reading, self.state.ledger.load(name)))

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


def _peers(r: RouterConfig, worker: int | None, apply: Callable[[PeerEvent], bool],
           registers: Callable[[], list[EngineEvent]]) -> Peers | None:
    """The link to the other router workers; None for a lone router."""
    if r.workers == 1:
        return None
    if worker is None or not r.sync_dir or r.port is None:
        raise ValueError(f"router.workers = {r.workers}: each process needs --worker I "
                         "(0..workers-1), router.port and router.sync_dir (the launcher "
                         "sets both)")
    return Peers(sync_endpoints(r.sync_dir, r.port, r.workers), worker, apply, registers)

