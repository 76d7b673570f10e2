"""Shortest-Total-Job-First with aging (Chimera section 3.7) as a vLLM scheduler.

The waiting queues are ``KeyedRequestQueue``s ordered by ``aging.AgingEntry.key()``
= ``(starvation_level, priority, arrival_time)``. After every ``schedule()`` the aging
tracker ticks once; requests whose level changed are re-inserted (never re-keyed in place).

Preemption under KV pressure: the base scheduler is switched to its FCFS branch, whose
victim is ``running[-1]``, and ``running`` is sorted by key at the start of every
``schedule()``, so the victim is the running request with the worst key. Sorting also
serves running requests in key order when the token budget is short.

``STJFScheduler`` subclasses vLLM's synchronous ``Scheduler`` (forced on CPU);
``STJFAsyncScheduler`` subclasses ``AsyncScheduler`` so GPU engines keep async scheduling.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from scheduler_patches.aging import AgingSettings, AgingTracker
from scheduler_patches.queues import KeyedRequestQueue
from scheduler_patches.settings import from_table, hetserve_config


class STJFPolicy:
    """Mixin over a vLLM ``Scheduler`` class: STJF order with aging."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aging = AgingTracker(from_table(AgingSettings, hetserve_config(self.vllm_config)))
        self.policy = SchedulingPolicy.FCFS  # victim = running[-1]; see module docstring
        self.waiting = KeyedRequestQueue(self._waiting_key)
        self.kv_holding_waiting = KeyedRequestQueue(self._waiting_key)

    def _waiting_key(self, request: Request) -> tuple[int, int, float]:
        return self.aging.track(request.request_id, request.priority, request.arrival_time).key()

    def _running_key(self, request: Request) -> tuple[int, int, float]:
        entry = self.aging.entries.get(request.request_id)
        if entry is None:
            prio = self.aging.settings.effective_priority(request.priority)
            return (0, prio, request.arrival_time)
        return entry.key()

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self.running.sort(key=self._running_key)
        output = super().schedule(*args, **kwargs)
        for entry in self.aging.tick(tuple(output.num_scheduled_tokens)):
            request = self.requests.get(entry.request_id)
            if request is not None:
                self.waiting.rekey(request)
                self.kv_holding_waiting.rekey(request)
        return output

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        self.aging.forget(request.request_id)
        return super()._free_request(request, *args, **kwargs)


class STJFScheduler(STJFPolicy, Scheduler):
    """STJF with aging over vLLM's synchronous scheduler."""


class STJFAsyncScheduler(STJFPolicy, AsyncScheduler):
    """STJF with aging over vLLM's async scheduler (GPU default)."""
