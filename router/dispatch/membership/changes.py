"""``EngineChanges``: the engines routed to, changed: marked down or up, moved, added, removed.

One place applies each change to everything that knows the engines: the engine table and
the in-flight ledger (``router.state``), the cluster file as the router holds it (an add is
checked against it: ``router.config.cluster.with_engine``), the health prober's URLs, the
subscriptions (``Subscriptions``) and the routing policy. Who asked (the launcher, an
operator, a failed call, another router worker) and how the change is shared is the
caller's concern (``Membership``, ``PeerSync``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from router.config.cluster import ClusterConfig, with_engine, without_engine
from router.config.engines import EngineInstance, MAX_NODE_CHARS
from router.dispatch.health_probe import HealthProber
from router.dispatch.membership.subscriptions import Subscriptions, Unused
from router.dispatch.peers import MAX_URL_CHARS
from router.policies.base import Policy
from router.state.cluster import ClusterState
from router.state.engines import EngineTable
from router.state.stats import StreamCounters

log = logging.getLogger("hetserve.router")


class Instances(Mapping[str, EngineInstance]):
    """The engine instances routed to, read from the engine table (the one list of
    engines): name -> what it was started as (``EngineState.instance``), in name order."""

    def __init__(self, table: EngineTable) -> None:
        self._table = table

    def __getitem__(self, name: str) -> EngineInstance:
        instance: EngineInstance = self._table.engines[name].instance
        return instance

    def __contains__(self, name: object) -> bool:
        return name in self._table.engines

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.engines)

    def __len__(self) -> int:
        return len(self._table.engines)


class EngineChanges:
    """Marks, moves, adds and removals of engines, applied to the router's every part."""

    def __init__(self, config: ClusterConfig, state: ClusterState, prober: HealthProber,
                 subscriptions: Subscriptions) -> None:
        self.config, self.state = config, state
        self.prober, self.subscriptions = prober, subscriptions
        instances = config.instances()
        self.instances = Instances(state.table)
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
        engine may move to another host (``move``)."""
        self.policy: Policy[Any] | None = None
        """The routing policy, told of engines added and removed (``RouterCore`` sets it)."""

    def mark(self, instance: str, up: bool, reason: str, probe: bool = False) -> None:
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

    def move(self, instance: str, url: str, node: str | None = None) -> None:
        """Route to ``instance`` at ``url`` from now on (ValueError: an unknown instance,
        or a URL that is not ``http://<the same host>:PORT``; any host for an engine
        placed on a Ray node, ``node`` its new node)."""
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

    def add(self, entry: dict[str, Any]) -> EngineInstance:
        """Route to one more engine, the cluster-file ``entry`` (checked by
        ``router.config.with_engine``: ConfigError, a ValueError)."""
        state = self.state
        self.config = with_engine(self.config, entry, state.table.served, self._models)
        inst = next(i for i in self.config.instances() if i.name == entry["name"])
        model = inst.served_model_name
        engines = state.table.models.get(model)
        like = engines[0].name if engines else self._first[model]
        state.table.add(inst)
        state.stats.engines.setdefault(inst.name, StreamCounters())
        self.nodes[inst.name] = inst.node
        self.prober.urls[inst.name] = inst.url
        self.subscriptions.add(inst)
        if self.policy is not None:
            self.policy.add_engine(inst.name, model, like)
        log.warning("engine %s added (%s at %s)", inst.name, model, inst.url)
        return inst

    def replace(self, entry: dict[str, Any]) -> Unused:
        """Make way for another worker's add of ``entry`` over the engine of that name
        here (two adds at once): the add is checked as a whole first (ConfigError), then
        the engine here is removed; the endpoints to unsubscribe."""
        name = entry["name"]
        with_engine(without_engine(self.config, name, last=True), entry,
                    self.state.table.served, self._models)
        return self.remove(name, drained=False)

    def remove(self, instance: str, drained: bool = True) -> Unused:
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
        inst = e.instance
        state.table.remove(instance)
        self.nodes.pop(instance, None)
        self.prober.urls.pop(instance, None)
        self.prober.forget(instance)
        if self.policy is not None:
            self.policy.remove_engine(instance)
        log.warning("engine %s removed", instance)
        return self.subscriptions.remove(inst, self.endpoints())

    def endpoints(self) -> set[str | None]:
        """The telemetry and KV-event endpoints of the engines routed to."""
        return {ep for i in self.instances.values()
                for ep in (i.telemetry_endpoint, i.kv_events_endpoint)}
