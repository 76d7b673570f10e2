"""Admission that knows programs (issue 32, item 2) as a mixin over the STJF scheduler.

Under KV pressure, a waiting call whose program's prefix blocks retention holds
(``scheduler_patches.retention``) is admitted before new calls of its starvation level:
it resumes on the blocks it finds cached, where a new call admitted ahead of it would
take free blocks and, once they run out, release (evict) protected ones, its own among
them. vllm-router's program scheduling pauses new programs and resumes returning ones
under capacity pressure across ranks; this is the same preference inside one engine.

The waiting key becomes ``(starvation_level, rank, priority, arrival_time)``, ``rank`` 0
for such a *resumable* call at level 0 while the engine is under pressure, 1 otherwise:

- **pressure**: the waiting calls' tokens still to compute, counted without their cache
  hits and with one partial block each, need more blocks than vLLM's free queue holds
  (``kv_pressure``), so admitting them in STJF's order could evict protected blocks.
  Without pressure, or with the setting off, the order is STJF's exactly;
- **aging bounds every wait**: the rank orders level 0 only. A call passed over ``S``
  times is promoted to level -1, ahead of every resumable call still at level 0, and from
  then on sorts as under STJF alone (docs/engine.md "The STJF scheduler"): admission
  lengthens no wait beyond the ``S`` pass-overs a call spends at level 0;
- **no refusal, no deadlock**: admission only reorders the waiting queue; vLLM's own loop
  admits from its head, and retention's free-block floor still releases protections
  rather than fail an allocation.

Keys change only by ``rekey`` (the queue's rule): the set of preferred calls is recomputed
at the start of every ``schedule()``, in O(protected programs) under pressure and O(1)
otherwise, and only calls whose rank changed are re-inserted. Importable without vLLM
(the engine server checks the settings before vLLM starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pydantic

from scheduler_patches.settings import STRICT, from_table, hetserve_config

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


@pydantic.dataclasses.dataclass(frozen=True, config=STRICT)
class AdmissionSettings:
    """Program-aware admission (a key of the ``hetserve`` table of ``additional_config``).

    Off by default: it changes STJF's order under pressure and has not been measured to
    help (docs/research/retention.md, "Admission that knows programs": in the twin's runs
    at 16k KV tokens per engine its pressure never held); on, for an A/B, where
    admissions evict returning programs.
    """

    admit_returning_first: bool = False
    """Under KV pressure, admit a waiting call whose program's blocks retention holds
    before new calls of its starvation level (STJF only)."""



def kv_pressure(free_blocks: int, pending_tokens: int, num_waiting: int,
                block_size: int) -> bool:
    """Whether waiting calls with ``pending_tokens`` still to compute (cache hits not
    counted) could need more blocks than the ``free_blocks`` of vLLM's free queue."""
    return -(-pending_tokens // block_size) + num_waiting > free_blocks


class ProgramAdmission:
    """Mixin between ``RetentionPolicy`` and ``STJFPolicy``: resumable calls first under
    KV pressure. Reads retention's table and calls (``retention``, ``program_calls``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admission = from_table(AdmissionSettings, hetserve_config(self.vllm_config))
        self.admit_first: set[str] = set()
        """Waiting calls sorted ahead of their level's new calls, by request id."""
        self.admitted_first = 0
        """Calls admitted while they had the preference."""

    def _waiting_key(self, request: Request) -> tuple[Any, ...]:
        key = super()._waiting_key(request)
        if not self.admission.admit_returning_first:
            return key
        level, *rest = key
        return (level, 0 if level == 0 and request.request_id in self.admit_first else 1,
                *rest)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if self.admission.admit_returning_first and self.retaining:
            self._prefer(self._resumable() if self._under_pressure() else set())
        output = super().schedule(*args, **kwargs)
        if self.admit_first:
            for new in output.scheduled_new_reqs:
                if new.req_id in self.admit_first:
                    self.admitted_first += 1
        return output

    def _under_pressure(self) -> bool:
        return bool(self.waiting) and len(self.retention) > 0 and kv_pressure(
            self.kv_cache_manager.block_pool.get_num_free_blocks(),
            self.waiting.pending.total, len(self.waiting), self.block_size)

    def _resumable(self) -> set[str]:
        """Waiting calls of the protected programs."""
        programs, calls = self.retention.programs, self.program_calls
        if len(calls) < len(programs):
            pairs = (ids for p, ids in calls.items() if p in programs)
        else:
            pairs = (calls[p] for p in programs if p in calls)
        return {rid for ids in pairs for rid in ids
                if (request := self.requests.get(rid)) is not None and request in self.waiting}

    def _prefer(self, preferred: set[str]) -> None:
        """Make ``preferred`` the admit-first set, re-inserting the calls that changed."""
        if preferred == self.admit_first:
            return
        changed = preferred ^ self.admit_first
        self.admit_first = preferred
        for rid in changed:
            request = self.requests.get(rid)
            if request is not None:
                self.waiting.rekey(request)
                self.kv_holding_waiting.rekey(request)
