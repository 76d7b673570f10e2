"""Chimera's in-engine order (section 3.7): Shortest-Total-Job-First with aging.

Pure bookkeeping, no vLLM import: unit-testable on its own.

Key of a request, lowest first::

    key = (starvation_level, priority, arrival_time)

- ``priority``: the router's predicted total remaining output tokens of the request's
  workflow (``scheduler_patches.contract``); a request sent without one (priority 0) sorts as
  ``AgingSettings.unprioritized_priority``.
- ``starvation_level``: 0 for a normal request; every ``S`` consecutive ``schedule()``
  iterations a waiting request is passed over, it is promoted one level (level -1, -2, ...
  down to ``-max_promotions``), so it sorts ahead of every request of a higher level.
- After a promoted request has received ``Q`` scheduling iterations (steps in which it
  was scheduled) it is demoted back to level 0 and its counters restart.

Guarantee: a request that has waited ``k * S`` ticks (``k <= max_promotions``) sorts ahead
of every request that has waited less than ``k * S``; one that waits ``max_promotions * S``
ties only with requests as starved as itself, ordered among them by priority again.

Counting without touching every waiting request each step: a request's pass-over count
is ``tick - entered_tick`` (the ticks since it entered its current level while waiting),
so promotions are found by scanning one FIFO per level from the front (amortised O(1)
per request per promotion). Keys change only through ``tick()``, which reports which
requests moved so the queue can re-insert them; keys never change while an item sits
in a heap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Annotated

import pydantic
from pydantic import Field

from scheduler_patches.contract import NO_PRIORITY, PRIORITY_MAX
from scheduler_patches.settings import STRICT


@pydantic.dataclasses.dataclass(frozen=True, config=STRICT)
class AgingSettings:
    """Per-engine anti-starvation settings (Chimera section 3.7).

    The paper names the threshold S and the quantum Q but gives no values we could
    verify offline; with these defaults a passed-over request is promoted every ``S``
    engine steps (a few seconds on a GPU) and keeps its boost for ``Q`` steps.
    """

    starvation_threshold: Annotated[int, Field(ge=1)] = 128
    """S: pass-overs (schedule() iterations spent waiting) before a promotion."""
    quantum: Annotated[int, Field(ge=1)] = 64
    """Q: scheduling iterations a promoted request receives before it is demoted."""
    max_promotions: Annotated[int, Field(ge=0)] = 4
    """Deepest starvation level is ``-max_promotions``."""
    unprioritized_priority: Annotated[int, Field(ge=0, le=PRIORITY_MAX)] = PRIORITY_MAX
    """Priority used for requests sent without one (wire value 0)."""

    def effective_priority(self, wire_priority: int) -> int:
        return self.unprioritized_priority if wire_priority == NO_PRIORITY else wire_priority


@dataclass
class AgingEntry:
    """Aging state of one request, alive from arrival until it leaves the engine."""

    request_id: str
    priority: int
    arrival_time: float
    level: int = 0
    entered_tick: int = 0
    """Tick when the request last entered its level while waiting."""
    served: int = 0
    """Scheduling iterations received at the current (promoted) level."""
    waiting: bool = True

    def key(self) -> tuple[int, int, float]:
        return (self.level, self.priority, self.arrival_time)

    def pass_overs(self, tick: int) -> int:
        return tick - self.entered_tick if self.waiting else 0


@dataclass
class AgingTracker:
    """Keeps every request's ``AgingEntry`` and applies promotions and demotions."""

    settings: AgingSettings = field(default_factory=AgingSettings)
    tick_count: int = 0
    entries: dict[str, AgingEntry] = field(default_factory=dict)
    _fifos: dict[int, deque[tuple[int, AgingEntry]]] = field(default_factory=dict)

    def track(self, request_id: str, wire_priority: int, arrival_time: float) -> AgingEntry:
        """Entry for a request (created on first sight), marked waiting."""
        entry = self.entries.get(request_id)
        if entry is None:
            prio = self.settings.effective_priority(wire_priority)
            entry = AgingEntry(request_id, prio, arrival_time, entered_tick=self.tick_count)
            self.entries[request_id] = entry
            self._enqueue(entry)
        elif not entry.waiting:
            entry.waiting = True
            entry.entered_tick = self.tick_count
            self._enqueue(entry)
        return entry

    def forget(self, request_id: str) -> None:
        self.entries.pop(request_id, None)

    def tick(self, scheduled_ids: list[str] | tuple[str, ...]) -> list[AgingEntry]:
        """End of one ``schedule()`` iteration.

        ``scheduled_ids``: requests scheduled in this iteration. Every request still
        waiting has been passed over once more. Returns the waiting entries whose
        level changed (the queue must re-insert them); running entries may be demoted
        too, which only changes their preemption order.
        """
        self.tick_count += 1
        for rid in scheduled_ids:
            entry = self.entries.get(rid)
            if entry is None:
                continue
            entry.waiting = False
            if entry.level == 0:
                continue
            entry.served += 1
            if entry.served >= self.settings.quantum:
                entry.level, entry.served = 0, 0
        return self._promote_due()

    def _enqueue(self, entry: AgingEntry) -> None:
        if entry.level > -self.settings.max_promotions:
            self._fifos.setdefault(entry.level, deque()).append((entry.entered_tick, entry))

    def _promote_due(self) -> list[AgingEntry]:
        moved: list[AgingEntry] = []
        threshold = self.settings.starvation_threshold
        # Deepest level first, so a request is promoted at most once per tick.
        for level in sorted(self._fifos):
            fifo = self._fifos[level]
            while fifo and self.tick_count - fifo[0][0] >= threshold:
                entered, entry = fifo.popleft()
                current = self.entries.get(entry.request_id) is entry
                if not (current and entry.waiting and entry.level == level
                        and entry.entered_tick == entered):
                    continue  # stale: left, ran, or changed level since it was queued
                entry.level -= 1
                entry.served = 0
                entry.entered_tick = self.tick_count
                self._enqueue(entry)
                moved.append(entry)
        return moved
