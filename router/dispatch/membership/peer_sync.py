"""``PeerSync``: the admin changes versioned, and shared with the other router workers.

Every admin change (mark, move, add, remove) takes its engine's next version
(``router.state.engine_versions``), also in a lone router (its admin API reports it); with
``[router] workers = N`` it is published to the other workers (``router.dispatch.peers``),
whose changes and program-table updates come back here and are applied if they hold over
what this worker has (``apply``).
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from router.config.cluster import RouterConfig
from router.dispatch.membership.changes import EngineChanges
from router.dispatch.membership.subscriptions import Subscriptions
from router.dispatch.peers import (Added, Completed, EngineEvent, Marked, Moved, PeerEvent,
                                   Peers, Removed, Routed, State, sync_endpoints)
from router.state.cluster import ClusterState
from router.state.engine_versions import ORIGIN, EngineVersions, Version


class PeerSync:
    """Versions of the admin changes; their exchange with the other router workers."""

    def __init__(self, r: RouterConfig, worker: int | None, state: ClusterState,
                 changes: EngineChanges, subscriptions: Subscriptions,
                 clock: Callable[[], float]) -> None:
        """``worker``: this process's index among ``r.workers`` router processes serving
        one port; None for a lone router."""
        self.workers, self.worker = r.workers, worker
        self.state, self.changes, self.subscriptions = state, changes, subscriptions
        self.clock = clock
        self.versions = EngineVersions(changes.instances, worker or 0)
        """The admin changes' order across router workers."""
        self.peers = _peers(r, worker, self.apply, self.registers)
        """The link to the other router workers; None for a lone router."""

    def marked(self, instance: str, up: bool, reason: str) -> Version:
        """This worker marked ``instance``: its version, the mark sent to the peers."""
        version = self.versions.stamp(instance)
        self.versions.marked(instance, version, up, reason)
        self._publish(Marked(instance, version, up, reason))
        return version

    def moved(self, instance: str) -> Version:
        """This worker moved ``instance``: its version, the move sent to the peers."""
        version = self.versions.stamp(instance)
        url, node = self.state.table[instance].url, self.changes.nodes.get(instance)
        self.versions.moved(instance, version, url, node)
        self._publish(Moved(instance, version, url, node))
        return version

    def added(self, instance: str, entry: str) -> Version:
        """This worker added ``instance`` from ``entry`` (JSON): its version, the add sent
        to the peers."""
        version = self.versions.stamp(instance)
        self.versions.added(instance, version, entry)
        self._publish(Added(instance, version, entry))
        return version

    def removed(self, instance: str) -> Version:
        """This worker removed ``instance``: its version, the removal sent to the peers."""
        version = self.versions.stamp(instance)
        self.versions.removed(instance, version)
        self._publish(Removed(instance, version))
        return version

    def _publish(self, event: EngineEvent) -> None:
        if self.peers is not None:
            self.peers.publish(event)

    def apply(self, event: PeerEvent) -> bool:
        """A change another router worker made: False if a later change holds (dropped;
        ValueError: one naming what is not here)."""
        now, programs = self.clock(), self.state.programs
        if isinstance(event, Routed):
            if not any(e.model == event.model for e in self.state.table.engines.values()):
                raise ValueError(f"unknown model {event.model!r}")
            engine = event.engine if event.engine in self.state.table.engines else None
            programs.routed(event.program_id, event.model, now, engine)
        elif isinstance(event, Completed):
            programs.completed(event.program_id, event.final, event.error, now)
        elif isinstance(event, State):
            return self._apply_engine(event.event, joined=True)
        elif isinstance(event, (Marked, Moved, Added, Removed)):
            return self._apply_engine(event)
        else:  # Hello, Synced: the link's own (``Peers.feed``)
            raise ValueError(f"a {type(event).__name__} is not a change")
        return True

    def registers(self) -> list[EngineEvent]:
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
        changes, instances = self.changes, self.changes.instances
        if version.worker >= self.workers or (version.worker == self.worker and not joined):
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
            if name not in instances:  # kept for its add, should that come later
                versions.marked(name, version, event.up, event.reason)
                raise ValueError(f"unknown instance '{name}'")
            changes.mark(name, event.up, event.reason)
            versions.marked(name, version, event.up, event.reason)
        elif isinstance(event, Moved):
            if name not in instances:
                versions.moved(name, version, event.url, event.node)
                raise ValueError(f"unknown instance '{name}'")
            changes.move(name, event.url, event.node)
            versions.moved(name, version, event.url, event.node)
        elif isinstance(event, Removed):
            if name in instances:
                self.subscriptions.unsubscribe_later(changes.remove(name, drained=False),
                                                     changes.endpoints)
            versions.removed(name, version)
        else:
            self._put(entry, version, event.entry)
        return True

    def _put(self, entry: dict[str, Any], version: Version, text: str) -> None:
        """A peer's add of ``entry`` that holds (over an engine of that name here too:
        two adds at once): the engine as the entry has it, with the marks and moves that
        came before their add (from a third worker) but are newer."""
        name, changes = entry["name"], self.changes
        if name in changes.instances:
            self.subscriptions.unsubscribe_later(changes.replace(entry), changes.endpoints)
        changes.add(entry)
        self.versions.added(name, version, text)
        if (mark := self.versions.mark(name)) is not None:
            changes.mark(name, mark.up, mark.reason)
        if (place := self.versions.place(name)) is not None:
            changes.move(name, place.url, place.node)


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
