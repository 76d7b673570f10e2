"""Program table (Chimera section 3.5): the model each running workflow program uses, and
the engine its last call went to (the one holding its prefix: ``router.policies.affinity``).

A program's first routed stage assigns its model; later stages reuse it (stickiness).
The entry leaves when the final stage completes successfully, or expires when the
program is abandoned: no stage routed or completed for ``ttl_s``; beyond ``max_programs``
entries the least recently active leaves first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ProgramEntry:
    model: str
    engine: str | None
    last_active: float
    ended: float | None = None
    """When its last call ended, until its next is routed."""
    return_s: float | None = None
    """How long its last return took: from a call's end to its next call (the agent's
    tool time)."""


class ProgramTable:
    def __init__(self, ttl_s: float, max_programs: int = 65_536) -> None:
        if not ttl_s > 0:
            raise ValueError(f"program_ttl_s must be > 0, got {ttl_s}")
        self.ttl_s, self.max_programs = ttl_s, max_programs
        self._programs: dict[str, ProgramEntry] = {}

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, program_id: str) -> bool:
        return program_id in self._programs

    def model(self, program_id: str | None) -> str | None:
        entry = self._programs.get(program_id) if program_id is not None else None
        return entry.model if entry else None

    def engine(self, program_id: str | None) -> str | None:
        """The engine of the program's last routed call (None: unknown)."""
        entry = self._programs.get(program_id) if program_id is not None else None
        return entry.engine if entry else None

    def return_s(self, program_id: str) -> float | None:
        """How long the program's last return took (None: unknown)."""
        entry = self._programs.get(program_id)
        return entry.return_s if entry else None

    def routed(self, program_id: str, model: str, now: float,
               engine: str | None = None) -> None:
        """A stage of ``program_id`` was routed to ``model`` (on ``engine``, when
        known)."""
        entry = self._programs.get(program_id)
        if entry is None or entry.model != model:
            entry = self._programs[program_id] = ProgramEntry(model, engine, now)
        if entry.ended is not None:
            entry.return_s, entry.ended = now - entry.ended, None
        entry.engine = engine or entry.engine
        entry.last_active = now
        programs = self._programs
        programs[program_id] = programs.pop(program_id)  # most recently active last
        while len(programs) > self.max_programs:
            del programs[next(iter(programs))]

    def completed(self, program_id: str, final: bool, error: bool, now: float) -> None:
        """A stage ended. A successful final stage ends the program; an error keeps the
        entry (the client may retry the stage) until it completes or expires."""
        entry = self._programs.get(program_id)
        if entry is None:
            return
        if final and not error:
            del self._programs[program_id]
        else:
            entry.last_active = entry.ended = now
            self._programs[program_id] = self._programs.pop(program_id)

    def expire(self, now: float) -> list[str]:
        """Drop programs idle for longer than the TTL; returns their ids (the table is in
        order of last activity: the scan stops at the first active one)."""
        gone = []
        for pid, e in self._programs.items():
            if now - e.last_active <= self.ttl_s:
                break
            gone.append(pid)
        for pid in gone:
            del self._programs[pid]
        return gone
