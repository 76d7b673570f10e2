"""Telemetry mixin for vLLM schedulers: publishes ``SchedulerSnapshot``s after each step.

Runs inside the EngineCore process. The step never blocks on I/O: when a frame is due
(rate limit ``telemetry_interval_ms``) or the engine just went idle, the snapshot is
built here and handed to ``TelemetryPublisher``'s thread. Building it costs O(running):
the waiting queues keep their prefill-token totals as requests come and go
(``scheduler_patches.queues.PendingTokens``).
Settings come from the ``hetserve`` table of vLLM's ``additional_config``
(``TelemetrySettings``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import pydantic
from pydantic import Field
from vllm.v1.core.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    RequestQueue,
)
from vllm.v1.request import Request

from engine_ext.curve import engine_curve
from engine_ext.kv_publisher import use_curve
from engine_ext.telemetry import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_INTERVAL_S,
    FinishedRequest,
    SchedulerSnapshot,
    SnapshotSink,
    TelemetryPublisher,
    server_pid,
)
from scheduler_patches.queues import CountingFCFSQueue, CountingPriorityQueue
from scheduler_patches.settings import STRICT, from_table, hetserve_config


@pydantic.dataclasses.dataclass(frozen=True, config=STRICT)
class TelemetrySettings:
    """The engine's telemetry (keys of the ``hetserve`` table of ``additional_config``)."""

    engine_id: str = "engine"
    """Topic of its snapshots and KV events (the router's engine id)."""
    telemetry_endpoint: str | None = None
    """Where snapshots are published; none: no telemetry."""
    telemetry_interval_ms: Annotated[float, Field(ge=0)] = DEFAULT_INTERVAL_S * 1e3
    """Least time between two snapshots while busy (0: every step)."""
    telemetry_heartbeat_ms: Annotated[float, Field(gt=0)] = DEFAULT_HEARTBEAT_S * 1e3
    """A snapshot repeated this often while idle or in a long step."""
    telemetry_keys_dir: str | None = None
    """CURVE keys of the telemetry plane (``engine_ext.curve``)."""


def with_token_ledger(queue: RequestQueue) -> RequestQueue:
    """The same kind of (empty) queue, keeping a ``pending`` prefill-token ledger."""
    if hasattr(queue, "pending"):
        return queue
    if len(queue):
        raise RuntimeError("can only swap an empty waiting queue")
    if type(queue) is FCFSRequestQueue:
        return CountingFCFSQueue()
    if type(queue) is PriorityRequestQueue:
        return CountingPriorityQueue()
    raise TypeError(f"no token-counting variant of {type(queue).__name__}")


class TelemetryMixin:
    """Place first in the bases of a vLLM ``Scheduler`` subclass."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        settings = from_table(TelemetrySettings, hetserve_config(
            kwargs.get("vllm_config", args[0] if args else None)))
        keys_dir = settings.telemetry_keys_dir
        curve = engine_curve(keys_dir) if keys_dir else None
        if curve is not None:  # before vLLM's __init__ makes its KV-event publisher
            use_curve(curve)
        super().__init__(*args, **kwargs)
        self.engine_id = settings.engine_id
        self.telemetry_step = 0
        self.telemetry_preemptions = 0
        self._finished: list[FinishedRequest] = []
        self._was_idle = True  # state of the last published snapshot
        self.waiting = with_token_ledger(self.waiting)
        self.kv_holding_waiting = with_token_ledger(self.kv_holding_waiting)
        self.telemetry: SnapshotSink | None = None
        if settings.telemetry_endpoint:
            self.attach_telemetry(TelemetryPublisher(
                settings.telemetry_endpoint,
                topic=self.engine_id,
                interval_s=settings.telemetry_interval_ms / 1e3,
                heartbeat_s=settings.telemetry_heartbeat_ms / 1e3,
                curve=curve,
                server_pid=server_pid(),
            ))

    def attach_telemetry(self, sink: SnapshotSink) -> None:
        """Send snapshots to ``sink`` from now on, announcing the engine's state at once
        (an engine's publisher then repeats it as heartbeats until work arrives)."""
        self.telemetry = sink
        sink.publish(self.snapshot(sink.next_seq()))

    # -- hooks --
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)
        self.telemetry_step += 1
        self._maybe_publish()
        return output

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        self._maybe_publish()
        return outputs

    def finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        finished = super().finish_requests(*args, **kwargs)
        self._maybe_publish()
        return finished

    def _preempt_request(self, *args: Any, **kwargs: Any) -> None:
        self.telemetry_preemptions += 1
        super()._preempt_request(*args, **kwargs)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        reason = request.get_finished_reason()
        self._finished.append(
            FinishedRequest(request.request_id, request.num_output_tokens, str(reason or "abort"))
        )
        return super()._free_request(request, *args, **kwargs)

    def shutdown(self) -> None:
        super().shutdown()
        if self.telemetry is not None:
            self.telemetry.close()

    # -- snapshot --
    def _maybe_publish(self) -> None:
        pub = self.telemetry
        if pub is None:
            self._finished.clear()
            return
        idle = not self.running and not self.waiting and not self.kv_holding_waiting
        # An engine going idle stops stepping: send its last state (and the requests that
        # just finished) now rather than at the next due time, which may never come.
        if not pub.due() and not (idle and (not self._was_idle or self._finished)):
            return
        self._was_idle = idle
        pub.publish(self.snapshot(pub.next_seq()))

    def snapshot(self, seq: int) -> SchedulerSnapshot:
        """Current state; takes (and clears) the requests finished since the last one."""
        queued_prefill = self.waiting.pending.total + self.kv_holding_waiting.pending.total
        pending_decode = 0
        for req in self.running:
            queued_prefill += max(0, req.num_prompt_tokens - req.num_computed_tokens)
            pending_decode += max(0, req.max_tokens - req.num_output_tokens)
        finished, self._finished = self._finished, []
        return SchedulerSnapshot(
            engine_id=self.engine_id,
            seq=seq,
            ts=self.telemetry.now() if self.telemetry is not None else time.time(),
            step=self.telemetry_step,
            batch_size=len(self.running),
            num_waiting=len(self.waiting) + len(self.kv_holding_waiting),
            queued_prefill_tokens=queued_prefill,
            pending_decode_tokens=pending_decode,
            kv_usage=float(self.kv_cache_manager.usage),
            num_preemptions=self.telemetry_preemptions,
            finished=finished,
        )
