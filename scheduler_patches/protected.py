"""Programs whose cached prefix blocks an engine keeps between calls (issue 32).

Pure bookkeeping over vLLM's block pool (no vLLM import: the pool is any object with
``touch`` and ``free_blocks``): ``scheduler_patches.retention`` decides when to protect
and release, this table how.

Mechanism: a protected block holds one extra reference (``pool.touch``) taken while the
finishing request still holds it, so when the request frees it its ``ref_cnt`` stays above
zero and it never enters vLLM's free queue, the only place blocks are evicted from.
Releasing drops that reference with ``pool.free_blocks`` in reverse order: the blocks
join the free queue's tail exactly as blocks of a request finishing now would (vLLM's
own LRU from there on; a block another request still holds stays where it is). Nothing
else in vLLM changes, and every operation costs O(blocks protected or released) plus
O(log programs) for the two heaps below, never O(pool).

Which program goes first when one must (the set is full, the protected blocks exceed
their share, or an allocation would fail): the one expected back last (Belady's rule:
evict what is next used furthest in the future). A program's expected next use is its
call's end plus the hint's expected return (the protection's deadline without one),
and "now" once its next call has arrived.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import pydantic
from pydantic import Field

from scheduler_patches.contract import MAX_EXPECTED_RETURN_S
from scheduler_patches.settings import STRICT, from_table


MAX_PROTECTED_PROGRAMS = 1_000_000
"""Most programs ``max_protected_programs`` may allow."""


@pydantic.dataclasses.dataclass(frozen=True, config=STRICT)
class RetentionSettings:
    """KV retention settings (keys of the ``hetserve`` table of ``additional_config``).

    The defaults are judgement, not measurement: agentic tools run for seconds to tens
    of seconds, and half the KV pool stays vLLM's ordinary prefix cache.
    """

    retention_ttl_s: Annotated[float, Field(ge=0, le=MAX_EXPECTED_RETURN_S)] = 30.0
    """Longest protection after a call ends, in seconds; 0 turns retention off."""
    retention_slack: Annotated[float, Field(ge=1, le=1000)] = 2.0
    """A hint with an expected return R is protected for ``min(retention_ttl_s,
    retention_slack * R)``: a late return still finds its prefix."""
    max_protected_programs: Annotated[int, Field(ge=0, le=MAX_PROTECTED_PROGRAMS)] = 256
    """Programs protected at once; 0 turns retention off."""
    max_protected_fraction: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Protected blocks (counted once per program that holds them) are at most this
    fraction of the KV pool; above it the program expected back last is released."""
    retention_ttl_only: bool = False
    """A baseline (Continuum's rule): ignore the hints' expected return, so every
    non-final call is protected for ``retention_ttl_s`` and, when one must go, the
    protection that ends last goes first (the order of hints without an expected return)."""

    @property
    def enabled(self) -> bool:
        return self.retention_ttl_s > 0 and self.max_protected_programs > 0

    def ttl_s(self, expected_return_s: float | None) -> float:
        """How long a call's blocks stay protected after it ends."""
        if expected_return_s is None or self.retention_ttl_only:
            return self.retention_ttl_s
        return min(self.retention_ttl_s, self.retention_slack * expected_return_s)



class BlockPool(Protocol):
    """What the table uses of vLLM's ``BlockPool``."""

    def touch(self, blocks: Sequence[Any]) -> None: ...

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...


@dataclass(slots=True)
class Protection:
    blocks: list[Any]
    """The program's cached blocks, in allocation order."""
    deadline: float
    next_use: float
    version: int


class ProtectedPrograms:
    """The bounded set of protected programs and the block references they hold."""

    def __init__(self, settings: RetentionSettings, pool: BlockPool, num_blocks: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``num_blocks``: usable blocks of the pool (the share's base)."""
        self.settings, self.pool, self.clock = settings, pool, clock
        self.max_blocks = int(settings.max_protected_fraction * num_blocks)
        self.programs: dict[str, Protection] = {}
        self.num_blocks = 0
        """Block references held (a block two programs protect counts twice)."""
        self.released: Counter[str] = Counter()
        """Programs released, by reason."""
        self.refused = 0
        """Calls not protected: the set was full of programs expected back sooner, or
        the call alone held more blocks than the share."""
        self._expiry: list[tuple[float, int, str]] = []  # (deadline, version, program)
        self._furthest: list[tuple[float, int, str]] = []  # (-next_use, version, program)
        self._versions = itertools.count()

    def __len__(self) -> int:
        return len(self.programs)

    def __contains__(self, program_id: str) -> bool:
        return program_id in self.programs

    def protect(self, program_id: str, blocks: list[Any],
                expected_return_s: float | None) -> bool:
        """Protect ``blocks`` (held by a request that is ending: ``ref_cnt >= 1``) for
        ``program_id``, replacing its earlier protection; whether it is protected."""
        now = self.clock()
        if self.settings.retention_ttl_only:
            expected_return_s = None
        ttl = self.settings.ttl_s(expected_return_s)
        next_use = now + (ttl if expected_return_s is None else expected_return_s)
        old = self.programs.get(program_id)
        if len(blocks) > self.max_blocks or (
                old is None and len(self.programs) >= self.settings.max_protected_programs
                and not self._make_room(next_use)):
            self.refused += 1
            if old is not None:
                self.release(program_id, "replaced")
            return False
        self.pool.touch(blocks)
        if old is not None:
            self.release(program_id, "replaced")
        self.programs[program_id] = Protection(blocks, now + ttl, next_use, 0)
        self.num_blocks += len(blocks)
        self._push(program_id)
        while self.num_blocks > self.max_blocks and self.release_furthest("share"):
            pass
        return program_id in self.programs

    def returned(self, program_id: str) -> None:
        """The program's next call arrived: keep its blocks at least ``retention_ttl_s``
        more, and release them last, until that call is scheduled."""
        entry = self.programs.get(program_id)
        if entry is not None:
            now = self.clock()
            entry.deadline = max(entry.deadline, now + self.settings.retention_ttl_s)
            entry.next_use = now
            self._push(program_id)

    def release(self, program_id: str, reason: str) -> bool:
        """Give a program's blocks back to vLLM's LRU; whether it was protected."""
        entry = self.programs.pop(program_id, None)
        if entry is None:
            return False
        self.num_blocks -= len(entry.blocks)
        self.pool.free_blocks(reversed(entry.blocks))
        self.released[reason] += 1
        return True

    def release_furthest(self, reason: str) -> bool:
        """Release the program expected back last; False when none is protected."""
        program = self._peek(self._furthest)
        return program is not None and self.release(program, reason)

    def expire(self) -> int:
        """Release the programs whose deadline has passed; how many."""
        now, n = self.clock(), 0
        while (program := self._peek(self._expiry)) is not None:
            if self.programs[program].deadline > now:
                break
            n += self.release(program, "expired")
        return n

    def release_all(self, reason: str) -> None:
        for program in list(self.programs):
            self.release(program, reason)

    def _make_room(self, next_use: float) -> bool:
        """At capacity: release the program expected back last if it is expected after
        ``next_use``; whether there is room now."""
        program = self._peek(self._furthest)
        if program is None or self.programs[program].next_use <= next_use:
            return False
        return self.release(program, "capacity")

    def _push(self, program_id: str) -> None:
        """(Re-)index a program after its keys changed; older heap entries go stale."""
        entry = self.programs[program_id]
        entry.version = next(self._versions)
        heapq.heappush(self._expiry, (entry.deadline, entry.version, program_id))
        heapq.heappush(self._furthest, (-entry.next_use, entry.version, program_id))
        if len(self._expiry) > 2 * len(self.programs) + 64:
            self._compact()

    def _peek(self, heap: list[tuple[float, int, str]]) -> str | None:
        """The live program at the top of ``heap`` (stale entries dropped)."""
        while heap:
            _, version, program = heap[0]
            entry = self.programs.get(program)
            if entry is not None and entry.version == version:
                return program
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        live = self.programs.items()
        self._expiry = [(e.deadline, e.version, p) for p, e in live]
        self._furthest = [(-e.next_use, e.version, p) for p, e in live]
        heapq.heapify(self._expiry)
        heapq.heapify(self._furthest)
