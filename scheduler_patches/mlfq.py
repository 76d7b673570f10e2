"""Multi-level feedback queue (Chimera's MLFQ baseline) as a vLLM scheduler.

A request's level is set by its attained service, the output tokens it has generated:
level k holds requests with ``base_quantum * (2**k - 1) <= attained < base_quantum *
(2**(k+1) - 1)`` (the quantum doubles per level), capped at ``mlfq_levels - 1``. Waiting
requests are served in ``(level, arrival_time)`` order; under KV pressure the running
request with the worst key is preempted. A waiting request's attained service cannot
change, so its key is fixed while it is queued.

Like vLLM's own policies (and Chimera's engines), running requests are not preempted to
admit a higher-level request; the order decides admission and preemption victims.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from pydantic import Field
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

from scheduler_patches.queues import KeyedRequestQueue
from scheduler_patches.settings import STRICT, from_table, hetserve_config


@pydantic.dataclasses.dataclass(frozen=True, config=STRICT)
class MLFQSettings:
    """MLFQ's levels (keys of the ``hetserve`` table of ``additional_config``)."""

    mlfq_levels: Annotated[int, Field(ge=1)] = 4
    """Number of levels."""
    mlfq_base_quantum: Annotated[int, Field(ge=1)] = 64
    """Output tokens of service at level 0 before demotion."""

    def level(self, attained: int) -> int:
        """Level k with base_quantum*(2^k - 1) <= attained < base_quantum*(2^(k+1) - 1)."""
        k = (attained // self.mlfq_base_quantum + 1).bit_length() - 1
        return min(k, self.mlfq_levels - 1)


class MLFQPolicy:
    """Mixin over a vLLM ``Scheduler`` class: MLFQ order by attained service."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mlfq = from_table(MLFQSettings, hetserve_config(self.vllm_config))
        self.policy = SchedulingPolicy.FCFS  # victim = running[-1], running sorted by key
        self.waiting = KeyedRequestQueue(self._key)
        self.kv_holding_waiting = KeyedRequestQueue(self._key)

    def _key(self, request: Request) -> tuple[int, float]:
        return (self.mlfq.level(request.num_output_tokens), request.arrival_time)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self.running.sort(key=self._key)
        return super().schedule(*args, **kwargs)


class MLFQScheduler(MLFQPolicy, Scheduler):
    """MLFQ over vLLM's synchronous scheduler."""


class MLFQAsyncScheduler(MLFQPolicy, AsyncScheduler):
    """MLFQ over vLLM's async scheduler."""
