"""Engine table: each engine's last scheduler snapshot, liveness and KV prefix index.

Liveness: an engine is down while it is marked down (failed HTTP calls, the launcher's
admin calls; only ``mark(up=True)`` clears a mark, which the health prober does for
failed calls) or while its snapshots have stopped for ``heartbeat_timeout_s``
(``scrape_timeout_s`` for a stock vLLM engine, whose snapshots are its scrapes), or for
``sole_timeout_s`` when no other engine of its model is live: routing around needs
somewhere to route to, and marking a model's last live engine down turns a late answer
(an engine starved of CPU, a router loop that fell behind) into a certain 503. An engine
that has not sent a snapshot yet is up (engines announce themselves at start and send
a heartbeat every 0.5 s when idle, so the router sees them within a second); after
its first snapshot it must keep sending them. When an engine goes down its KV index is
cleared and the caller releases its in-flight accounting; it receives nothing until it
is back.
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from engine_ext.telemetry import KVEventBatch, SchedulerSnapshot
from router.state.kv_index import KVPrefixIndex


@dataclass(slots=True)
class EngineState:
    name: str
    model: str
    url: str
    """Where it is now: its instance's URL, or where a move sent it."""
    max_model_len: int | None
    instance: Any
    """What it was started as (``router.config.engines.EngineInstance``: its kind,
    endpoints, API key, Ray node at the start): the table is the router's one list of
    engines, and ``Membership.instances`` reads it."""
    kv: KVPrefixIndex = field(default_factory=KVPrefixIndex)
    snapshot: SchedulerSnapshot | None = None
    last_seen: float | None = None
    """Router clock when the last snapshot arrived."""
    down_reason: str | None = None
    """Why the engine is down, ``None`` while up."""
    marked_down: str | None = None
    """Reason of an explicit down mark (sticky until marked up)."""
    last_kv_seq: int | None = None
    progress_at: float | None = None
    """Router clock when the scheduler last stepped (or had nothing to do)."""
    scraped: bool = False
    """A stock vLLM engine: its snapshots are ``/metrics`` scrapes."""
    down_at: float | None = None
    """The router's wall clock when it last went from up to down, for
    ``hetserve_engine_down_timestamp_seconds``."""
    received_at: float | None = None
    """The router's wall clock when the last snapshot arrived (``last_seen``'s moment),
    for ``hetserve_telemetry_received_timestamp_seconds``: beside the snapshot's own
    ``ts`` it shows how late the router read it."""


class EngineTable:
    def __init__(self, instances: Iterable[Any], heartbeat_timeout_s: float,
                 stall_timeout_s: float = 30.0, scrape_timeout_s: float = 10.0,
                 sole_timeout_s: float = 5.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """``instances``: objects with ``name, served_model_name, url, max_model_len``
        (and ``kind``: ``vllm`` for a scraped engine). ``stall_timeout_s``: an engine whose telemetry keeps coming (from its sender
        thread) with the scheduler's step unchanged for this long while work is running or
        waiting has a stalled scheduler: it is down until the step moves again."""
        if not heartbeat_timeout_s > 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.scrape_timeout_s = scrape_timeout_s
        self.sole_timeout_s = sole_timeout_s
        self.wall_clock = wall_clock
        """Stamps ``EngineState.down_at`` and ``received_at`` (the router's wall clock:
        simulated in the twin)."""
        self.engines: dict[str, EngineState] = {}
        """Engines in name order."""
        self.ordered: list[EngineState] = []
        self.models: dict[str, list[EngineState]] = {}
        """Served model -> its engines, in name order (a model with none is not here)."""
        self.served: set[str] = set()
        """The models served: the router's policy was built for them, and an engine of
        one may be added. One may have no engine left (other router workers' removals of
        its last engines: ``router.dispatch.membership``)."""
        for inst in instances:
            self._put(inst)
        self._index()

    def add(self, inst: Any) -> EngineState:
        """One more engine (a replica started while the router runs)."""
        e = self._put(inst)
        self._index()
        return e

    def _put(self, inst: Any) -> EngineState:
        if inst.name in self.engines:
            raise ValueError(f"two instances are named '{inst.name}'")
        self.served.add(inst.served_model_name)
        e = self.engines[inst.name] = EngineState(
            inst.name, inst.served_model_name, inst.url, inst.max_model_len, inst,
            scraped=getattr(inst, "kind", "hetserve") == "vllm")
        return e

    def remove(self, name: str) -> None:
        """An engine stops being routed to for good (a replica scaled away)."""
        del self.engines[name]
        self._index()

    def _index(self) -> None:
        self.engines = dict(sorted(self.engines.items()))
        self.ordered = list(self.engines.values())
        self.models = {}
        for e in self.ordered:
            self.models.setdefault(e.model, []).append(e)

    def __getitem__(self, name: str) -> EngineState:
        return self.engines[name]

    def on_snapshot(self, snap: SchedulerSnapshot, now: float) -> bool:
        """Store a snapshot; it brings an engine that went stale back up. True when it
        shows the engine's scheduler stalled and the engine was up until then.

        Snapshots come in the order the decoder's sequence rule accepted them
        (``engine_ext.telemetry.StreamStats``), so the latest one is the current state,
        also after a restart or resync that moved the sequence backwards."""
        e = self.engines[snap.engine_id]
        busy = snap.batch_size > 0 or snap.num_waiting > 0
        if e.snapshot is None or snap.step != e.snapshot.step or not busy:
            e.progress_at = now
        e.snapshot, e.last_seen, e.received_at = snap, now, self.wall_clock()
        if e.marked_down is not None:
            return False
        was_up, e.down_reason = e.down_reason is None, self._stalled(e, now)
        if was_up and e.down_reason is not None:
            e.down_at = self.wall_clock()
        return was_up and e.down_reason is not None

    def _stalled(self, e: EngineState, now: float) -> str | None:
        """Why ``e``'s scheduler counts as stalled, if it does."""
        still = now - e.progress_at if e.progress_at is not None else 0.0
        if e.snapshot is None or still <= self.stall_timeout_s:
            return None
        return (f"scheduler stalled: step {e.snapshot.step} for {still:.1f} s with "
                f"{e.snapshot.batch_size} running and {e.snapshot.num_waiting} waiting "
                f"(stall timeout {self.stall_timeout_s:g} s)")

    def on_kv_batch(self, name: str, seq: int, batch: KVEventBatch) -> None:
        """Apply a KV event batch the decoder's sequence rule accepted.

        The rule for the index: a batch numbered below the previous one means the sender
        went back for good, since the decoder drops a single stale or duplicate batch
        and passes a step back only for a restart (sequence 0) or a confirmed resync
        (two batches agreeing). The engine's old blocks may be gone, so the index is
        cleared before the batch is applied. A forward resync keeps the index (the
        sender is the same process; what it lost is like a gap)."""
        e = self.engines[name]
        if e.last_kv_seq is not None and seq < e.last_kv_seq:
            e.kv.clear()
        e.last_kv_seq = seq
        for event in batch.events:
            e.kv.apply(event)

    def mark(self, name: str, up: bool, reason: str) -> bool:
        """Explicit mark; True if the engine went down because of it."""
        e = self.engines[name]
        if up:
            if e.down_reason is not None:  # a restarted engine starts without telemetry
                e.marked_down = e.down_reason = None
                e.snapshot = e.last_seen = e.received_at = None
            return False
        e.marked_down = reason or "marked down"
        return self._down(e, f"marked down: {e.marked_down}")

    def refresh(self, now: float) -> list[str]:
        """Apply heartbeat staleness; returns engines that just went down."""
        went_down = []
        for e in self.engines.values():
            if e.down_reason is not None or e.last_seen is None:
                continue
            silent, timeout = now - e.last_seen, self._timeout(e)
            sole = silent > timeout and not any(
                self._live(o, now) for o in self.models[e.model] if o is not e)
            if sole:
                timeout = max(timeout, self.sole_timeout_s)
            if silent > timeout:
                what = "good /metrics scrape" if e.scraped else "telemetry"
                kind = "sole engine" if sole else "scrape" if e.scraped else "heartbeat"
                self._down(e, f"no {what} for {silent:.1f} s ({kind} timeout {timeout:g} s)")
                went_down.append(e.name)
        return went_down

    def _timeout(self, e: EngineState) -> float:
        return self.scrape_timeout_s if e.scraped else self.heartbeat_timeout_s

    def _live(self, e: EngineState, now: float) -> bool:
        """Up, and heard from within its own timeout (or not yet heard from)."""
        return e.down_reason is None and (e.last_seen is None
                                          or now - e.last_seen <= self._timeout(e))

    def _down(self, e: EngineState, reason: str) -> bool:
        was_up = e.down_reason is None
        e.down_reason = reason
        e.kv.clear()
        if was_up:
            e.down_at = self.wall_clock()
        return was_up
