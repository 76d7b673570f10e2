"""Per-engine versions that order the admin changes router workers share (issue 35).

With ``[router] workers = N`` an admin call (``POST /admin/engines/NAME/...``) reaches one
worker, which applies it and publishes it to the others (``router.dispatch.peers``); two
calls at once to different workers cross on the way. Each change therefore carries a
``Version``: a Lamport clock per engine name, ``(counter, worker index)``, ordered by
counter and then by worker index. A worker applies a change only if its version is above
the one it holds for what the change sets, so every worker ends with the same change,
the last writer's, whatever the order the changes arrived in.

What an engine's admin state is made of, each a last-writer-wins register with its own
version (``EngineRecord``):

- ``life``: added (with its entry) or removed (a tombstone). An add or a remove
  supersedes every mark and move older than it: a re-added engine is up at its entry's
  URL.
- ``mark``: the launcher's or an operator's up or down (with the reason).
- ``place``: the URL (and Ray node) a move set.

The marks the router sets itself (a failed call's breaker, the health prober, silent
telemetry) are each worker's own observation: they are neither versioned nor shared.

The clock: a local change takes ``counter = max(highest counter seen for the engine + 1,
wall clock in ms)`` (``stamp``). The first term is Lamport's rule: a change made after a
worker has seen another is ordered after it. The second makes a worker that restarted
(it starts with the cluster file's engines, every counter at 0) win with its next call
over what it has not heard of, instead of losing until a message teaches it the
counters: the workers of one router share one host (their sockets are ``ipc://``), so one
clock. Two calls within the same millisecond are ordered by worker index.

A change naming an engine this worker does not have (a move or mark that overtook the
engine's add, possible with three or more workers) is not applied, but its version and
value are kept: the add, when it comes, takes them. Records of engines not here (removed
ones, and those never added) are bounded by ``max_absent`` (oldest dropped first); past
that a change older than a dropped removal could bring an engine back.

Everything here is pure: ``router.dispatch.membership`` asks ``newer`` before applying a
peer's change to the router's tables and records it after (``added``, ``removed``,
``marked``, ``moved``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Callable, Iterable, Literal, NamedTuple

import msgspec

from router.settings import MAX_WORKERS

MAX_COUNTER = 2**63 - 1
"""Largest counter a version carries (msgpack's signed 64-bit range)."""
MAX_ABSENT = 4096
"""Most records of engines not here (tombstones and early marks) a worker keeps."""


class Version(msgspec.Struct, array_like=True, frozen=True, order=True):
    """A change's place in its engine's order: by ``counter``, then by ``worker``."""

    counter: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNTER)]
    worker: Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORKERS)]


ORIGIN = Version(0, 0)
"""The cluster file's engines: below every version a change carries (counter >= 1)."""


class Mark(NamedTuple):
    version: Version
    up: bool
    reason: str


class Place(NamedTuple):
    version: Version
    url: str
    node: str | None


Field = Literal["life", "mark", "place"]


@dataclass(slots=True)
class EngineRecord:
    """One engine name's registers."""

    seen: Version
    """The highest version seen for the name (the clock)."""
    life: Version
    """The add or remove that holds."""
    present: bool
    entry: str | None = None
    """The added engine's entry (JSON); None for the cluster file's or a removed one."""
    mark: Mark | None = None
    """The admin mark newer than ``life``, if any (an older one is dropped)."""
    place: Place | None = None
    """The move newer than ``life``, if any (else the entry's URL holds)."""

    def version(self, field: Field) -> Version:
        """What a change of ``field`` must be above to be applied."""
        reg = None if field == "life" else self.mark if field == "mark" else self.place
        return self.life if reg is None else max(self.life, reg.version)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class EngineVersions:
    """Each engine name's versions, as one worker holds them."""

    def __init__(self, names: Iterable[str], worker: int,
                 clock_ms: Callable[[], int] = wall_ms, max_absent: int = MAX_ABSENT) -> None:
        """``names``: the cluster file's engines (at ``ORIGIN``); ``worker``: this worker's
        index; ``clock_ms``: the floor of a local change's counter (``stamp``)."""
        if max_absent < 1:
            raise ValueError(f"max_absent must be >= 1, got {max_absent}")
        self.worker, self.clock_ms, self.max_absent = worker, clock_ms, max_absent
        self.records: dict[str, EngineRecord] = {n: EngineRecord(ORIGIN, ORIGIN, True)
                                                 for n in names}
        self._absent: dict[str, None] = {}
        """Names whose record is not of an engine here, oldest first."""

    def stamp(self, name: str) -> Version:
        """The version of a change made here now (above every one seen for ``name``)."""
        rec = self._record(name)
        counter = max(rec.seen.counter + 1, min(self.clock_ms(), MAX_COUNTER))
        if counter > MAX_COUNTER:
            raise ValueError(f"engine '{name}': its version counter is exhausted")
        rec.seen = Version(counter, self.worker)
        return rec.seen

    def newer(self, name: str, field: Field, version: Version) -> bool:
        """Whether a change of ``field`` at ``version`` is to be applied (the clock learns
        ``version`` either way)."""
        rec = self._record(name)
        rec.seen = max(rec.seen, version)
        return version > rec.version(field)

    def added(self, name: str, version: Version, entry: str) -> None:
        rec = self._record(name)
        rec.life, rec.present, rec.entry = version, True, entry
        self._absent.pop(name, None)
        self._settled(rec, version)

    def removed(self, name: str, version: Version) -> None:
        rec = self._record(name)
        rec.life, rec.present, rec.entry = version, False, None
        self._settled(rec, version)
        self._away(name)

    def marked(self, name: str, version: Version, up: bool, reason: str) -> None:
        rec = self._record(name)
        rec.mark = Mark(version, up, reason)
        rec.seen = max(rec.seen, version)

    def moved(self, name: str, version: Version, url: str, node: str | None) -> None:
        rec = self._record(name)
        rec.place = Place(version, url, node)
        rec.seen = max(rec.seen, version)

    def mark(self, name: str) -> Mark | None:
        """The admin mark that holds over ``name``'s add (None: none since)."""
        rec = self.records.get(name)
        return rec.mark if rec is not None else None

    def place(self, name: str) -> Place | None:
        """The move that holds over ``name``'s add (None: none since, its entry's URL)."""
        rec = self.records.get(name)
        return rec.place if rec is not None else None

    def entry(self, name: str) -> str | None:
        rec = self.records.get(name)
        return rec.entry if rec is not None else None

    @staticmethod
    def _settled(rec: EngineRecord, life: Version) -> None:
        """An add or remove at ``life``: the registers it supersedes are dropped."""
        rec.seen = max(rec.seen, life)
        if rec.mark is not None and rec.mark.version < life:
            rec.mark = None
        if rec.place is not None and rec.place.version < life:
            rec.place = None

    def _record(self, name: str) -> EngineRecord:
        rec = self.records.get(name)
        if rec is None:  # an engine not here: the first word of it
            rec = self.records[name] = EngineRecord(ORIGIN, ORIGIN, False)
            self._away(name)
        return rec

    def _away(self, name: str) -> None:
        """``name`` is (now) not an engine here: its record counts against ``max_absent``."""
        self._absent.pop(name, None)
        self._absent[name] = None
        while len(self._absent) > self.max_absent:
            oldest = next(iter(self._absent))
            del self._absent[oldest]
            del self.records[oldest]
