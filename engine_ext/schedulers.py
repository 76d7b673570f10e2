"""The scheduler classes an engine runs: each engine policy, with telemetry and KV
retention (``scheduler_patches.retention``), sync and async; STJF's also with program-aware
admission (``scheduler_patches.program_admission``, off unless its setting is on).

``scheduler_class(policy, async_scheduling)`` gives the dotted path for vLLM's
``--scheduler-cls``. ``fcfs`` and ``priority`` are vLLM's own policies (the engine also
gets ``--scheduling-policy`` accordingly); ``stjf`` and ``mlfq`` are ours.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from engine_ext.instrumented import TelemetryMixin
from scheduler_patches.mlfq import MLFQPolicy
from scheduler_patches.program_admission import ProgramAdmission
from scheduler_patches.retention import RetentionPolicy
from scheduler_patches.settings import ENGINE_POLICIES
from scheduler_patches.stjf import STJFPolicy


class VLLMScheduler(TelemetryMixin, RetentionPolicy, Scheduler):
    """vLLM's scheduler (fcfs or priority, per --scheduling-policy), with telemetry and
    retention."""


class VLLMAsyncScheduler(TelemetryMixin, RetentionPolicy, AsyncScheduler):
    """vLLM's async scheduler with telemetry and retention."""


class STJFScheduler(TelemetryMixin, RetentionPolicy, ProgramAdmission, STJFPolicy, Scheduler):
    """Chimera's STJF with aging, with telemetry, retention and program-aware admission."""


class STJFAsyncScheduler(TelemetryMixin, RetentionPolicy, ProgramAdmission, STJFPolicy,
                         AsyncScheduler):
    """Chimera's STJF with aging over the async scheduler, with telemetry, retention and
    program-aware admission."""


class MLFQScheduler(TelemetryMixin, RetentionPolicy, MLFQPolicy, Scheduler):
    """MLFQ baseline, with telemetry and retention."""


class MLFQAsyncScheduler(TelemetryMixin, RetentionPolicy, MLFQPolicy, AsyncScheduler):
    """MLFQ baseline over the async scheduler, with telemetry and retention."""


_CLASSES = {
    ("fcfs", False): VLLMScheduler,
    ("fcfs", True): VLLMAsyncScheduler,
    ("priority", False): VLLMScheduler,
    ("priority", True): VLLMAsyncScheduler,
    ("stjf", False): STJFScheduler,
    ("stjf", True): STJFAsyncScheduler,
    ("mlfq", False): MLFQScheduler,
    ("mlfq", True): MLFQAsyncScheduler,
}


def scheduler_type(policy: str, async_scheduling: bool) -> type[Scheduler]:
    """The scheduler class for an engine policy."""
    if policy not in ENGINE_POLICIES:
        raise ValueError(f"unknown engine policy {policy!r}; choose one of {ENGINE_POLICIES}")
    return _CLASSES[(policy, async_scheduling)]


def scheduler_class(policy: str, async_scheduling: bool) -> str:
    """Dotted path of the scheduler class for an engine policy (``--scheduler-cls``)."""
    cls = scheduler_type(policy, async_scheduling)
    return f"{cls.__module__}.{cls.__qualname__}"
