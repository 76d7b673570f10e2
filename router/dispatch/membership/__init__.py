"""``Membership``: which engines the router routes to, and what it hears from them.

Composed of one part per job, each in its own module or class:

- ``Subscriptions`` (``subscriptions``): every engine's telemetry and KV events over
  ZeroMQ (CURVE-authenticated when the cluster has keys), and the ``/metrics`` scrapes of
  stock vLLM engines (``router.dispatch.scraper``), applied to the router state;
- ``HealthProber`` (``router.dispatch.health_probe``): brings back engines a failed call
  marked down;
- ``EngineChanges`` (``changes``): marks, moves, adds and removals applied to the table,
  the prober, the subscriptions and the policy;
- ``PeerSync`` (``peer_sync``): the admin changes' versions, and the exchange of them and
  of the program table's changes with the other router workers (``router.dispatch.peers``).

``Membership`` starts and stops them (over one ZeroMQ context) and answers the admin
verdicts of the launcher and operators: a change applied here, then versioned and shared.
Given a telemetry source (``router.telemetry_source``), it starts that source into the
``Subscriptions`` instead of their ZeroMQ subscriptions and scrapes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import msgspec
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from router.config.cluster import ClusterConfig
from router.config.engines import EngineInstance
from router.dispatch.health_probe import HealthProber
from router.dispatch.membership.changes import EngineChanges
from router.dispatch.membership.peer_sync import PeerSync
from router.dispatch.membership.subscriptions import Subscriptions
from router.dispatch.peers import MAX_ENTRY_CHARS
from router.state.cluster import ClusterState
from router.state.engine_versions import Version
from router.state.stats import RouterStats
from router.state.view import EngineView, engine_view
from router.telemetry_source import TelemetrySource

log = logging.getLogger("hetserve.router")
SWEEPS_PER_TIMEOUT = 10
"""How often per ``heartbeat_timeout_s`` a worker applies the timeouts without being asked
(``Membership._sweep``): while the event loop runs, a silent engine goes down at most a tenth of a
timeout late."""


class Membership:
    """The engines routed to: its parts started together, and the admin verdicts."""

    def __init__(self, config: ClusterConfig, state: ClusterState,
                 clock: Callable[[], float] = time.monotonic, worker: int | None = None,
                 telemetry: TelemetrySource | None = None) -> None:
        """``worker``: this process's index among ``config.router.workers`` router
        processes serving one port (``router.dispatch.peers``); None for a lone router.
        ``telemetry``: where the engines' telemetry comes from; None: the engines'
        ZeroMQ streams and ``/metrics``."""
        r = config.router
        self.state, self.clock = state, clock
        instances = config.instances()
        self.prober = HealthProber({i.name: i.url for i in instances},
                                   lambda name: self.changes.mark(name, True, "health probe"),
                                   backoff_s=r.breaker_backoff_s,
                                   backoff_max_s=r.breaker_backoff_max_s)
        self.subscriptions = Subscriptions(r, state, instances, self.prober.urls, clock)
        self.changes = EngineChanges(config, state, self.prober, self.subscriptions)
        self.sync = PeerSync(r, worker, state, self.changes, self.subscriptions, clock)
        # What the front, /metrics and the benchmarks read, named as they read it:
        self.instances = self.changes.instances
        self.nodes: dict[str, str | None] = self.changes.nodes
        subs = self.subscriptions
        self.snapshots, self.kv_events, self.scraper = subs.snapshots, subs.kv_events, subs.scraper
        self.versions, self.peers = self.sync.versions, self.sync.peers
        self.telemetry = telemetry
        self._zap: AsyncioAuthenticator | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe to every engine's telemetry and KV events (or start the telemetry
        source), link the peers, probe."""
        self._ctx = zmq.asyncio.Context()
        curve = self.subscriptions.curve
        if curve is not None and self.telemetry is None:  # ZAP: only the engines' key
            self._zap = AsyncioAuthenticator(self._ctx, log=log)
            self._zap.start()
            self._zap.configure_curve_callback("*", curve)
        try:
            if self.telemetry is None:
                await self.subscriptions.start(self._ctx, [
                    i.name for i in self.instances.values() if i.kind == "vllm"])
            else:
                await self.telemetry.start(self.subscriptions)
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
        await self.subscriptions.stop()
        if self.telemetry is not None:
            await self.telemetry.stop()
        if self.peers is not None:
            await self.peers.stop()
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def engines(self) -> list[EngineView]:
        now = self.clock()
        self.state.maintain(now)
        return [engine_view(e, self.state.ledger, now) for e in self.state.table.engines.values()]

    @property
    def stats(self) -> RouterStats:
        """Counters, with the subscribers' dropped-frame counts brought up to date."""
        return self.subscriptions.stats

    def mark_engine(self, instance: str, up: bool, reason: str, probe: bool = False) -> None:
        """This worker's own mark (a failed call: ``probe=True``): ``EngineChanges.mark``,
        neither versioned nor shared."""
        self.changes.mark(instance, up, reason, probe)

    # ---- the launcher's and operators' verdicts: applied here, then shared ----

    def admin_mark(self, instance: str, up: bool, reason: str) -> Version:
        """Mark an engine down or up (ValueError: an unknown instance); its version."""
        self.changes.mark(instance, up, reason)
        return self.sync.marked(instance, up, reason)

    def admin_move(self, instance: str, url: str, node: str | None = None) -> Version:
        """The launcher restarted ``instance`` on another port (same host; any host for an
        engine it placed on a Ray node, ``node`` its new node): route to ``url`` from now
        on (ValueError: ``EngineChanges.move``); its version."""
        self.changes.move(instance, url, node)
        return self.sync.moved(instance)

    def admin_add(self, entry: dict[str, Any]) -> tuple[EngineInstance, Version]:
        """The launcher started one more replica of a served model: validate its
        cluster-file ``entry`` (``router.config.with_engine``; ConfigError, a ValueError)
        and route to it; the new instance and the add's version."""
        text = msgspec.json.encode(entry).decode()
        if len(text) > MAX_ENTRY_CHARS:  # the other workers could not take it
            raise ValueError(f"the entry is over {MAX_ENTRY_CHARS} characters as JSON")
        inst = self.changes.add(entry)
        return inst, self.sync.added(inst.name, text)

    async def admin_remove(self, instance: str) -> Version:
        """The launcher drained ``instance`` (marked down, nothing in flight) and stops
        it: forget it (ValueError: not marked down, requests still in flight, or not
        removable: ``without_engine``); its version."""
        unused = self.changes.remove(instance)
        version = self.sync.removed(instance)
        await self.subscriptions.unsubscribe(unused, self.changes.endpoints)
        return version
