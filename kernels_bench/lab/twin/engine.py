"""One engine instance in the twin: vLLM's real scheduler and KV cache manager, a modelled
forward pass.

The scheduler is the class the engine runs (``engine_ext.schedulers.scheduler_type`` for
its ``sched_policy``, the synchronous variant, as on CPU), built with no model executor
(``kernels_bench.lib.scheduler_harness``), sized by an ``EngineSpec``, with prefix caching on.
KV retention (``scheduler_patches.retention``, in every hetserve scheduler class) runs on
the virtual clock: the twin sets ``scheduler.retention.clock``, which is the engine's
monotonic clock live. A step is what vLLM's ``EngineCore`` does: take the requests that
arrived, ``schedule()``, run the model (here: wait ``StepTimeModel.step_ms``),
``update_from_output`` with one made-up sampled token per request whose step reaches its
last token.

A stock vLLM engine (``EngineSpec.stock``) runs vLLM's own ``Scheduler`` class, unpatched,
and publishes vLLM's KV events but no snapshots; what its ``/metrics`` would show is
``metrics``, which the twin's router scrapes.
"""

from __future__ import annotations

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from engine_ext.schedulers import scheduler_type
from kernels_bench.lab.twin.engine_spec import EngineSpec
from kernels_bench.lab.twin.request import RequestRecord, TwinRequest
from kernels_bench.lab.twin.step_time import StepTimeModel
from kernels_bench.lab.twin.telemetry import Clock, KVEventFrames, SnapshotFrames
from kernels_bench.lib.scheduler_harness import block_hasher, fake_output, make_scheduler
from router.state.vllm_metrics import VllmMetrics
from scheduler_patches.settings import vllm_scheduling_policy


class EngineTwin:
    """An engine on a virtual clock; the simulator calls ``receive`` and ``step``."""

    def __init__(self, spec: EngineSpec, step_time: StepTimeModel, clock: Clock,
                 telemetry_interval_s: float | None = None) -> None:
        """``telemetry_interval_s``: publish snapshots at this rate (none from a stock
        engine) and vLLM's KV events (``snapshots`` / ``kv_events`` collect the frames);
        None: no telemetry."""
        self.spec = spec
        self.name = spec.name
        self.step_time = step_time
        self.clock = clock
        self.scheduler = make_scheduler(
            Scheduler if spec.stock else scheduler_type(spec.sched_policy,
                                                        async_scheduling=False),
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            num_blocks=spec.num_blocks,
            policy=vllm_scheduling_policy(spec.sched_policy),
            hetserve={"engine_id": spec.name, "policy": spec.sched_policy, **spec.settings},
            block_size=spec.block_size,
            max_model_len=spec.max_model_len,
            kv_cache_events=telemetry_interval_s is not None,
        )
        retention = getattr(self.scheduler, "retention", None)
        if retention is not None:
            retention.clock = clock
        self.snapshots: SnapshotFrames | None = None
        self.kv_events: KVEventFrames | None = None
        if telemetry_interval_s is not None:
            self.kv_events = KVEventFrames(spec.name, clock)
            self.scheduler.kv_event_publisher = self.kv_events
            if not spec.stock:
                self.snapshots = SnapshotFrames(spec.name, clock, telemetry_interval_s)
                self.scheduler.attach_telemetry(self.snapshots)
        self.records: dict[str, RequestRecord] = {}
        self.busy = False
        """A step is running or about to start (the simulator's flag)."""
        self.steps = 0
        self.preemptions = 0
        """Requests preempted (vLLM's ``vllm:num_preemptions``)."""
        self.busy_s = 0.0
        """Virtual seconds spent in steps."""
        self.metrics = VllmMetrics(0, 0, 0.0, 0, 0)
        """What the engine's ``/metrics`` shows now: vLLM's gauges as its scheduler last
        set them (at the end of a step, where it makes its stats), the preemption and
        token counters (prompt tokens counted at a request's first token, as vLLM's)."""
        self._tokens = 0
        self._inbox: list[Request] = []
        self._running: tuple[SchedulerOutput, ModelRunnerOutput] | None = None
        self._hasher = block_hasher(spec.block_size)

    def receive(self, request: TwinRequest) -> RequestRecord:
        """A request arrives now; it joins the scheduler before the next step."""
        if request.request_id in self.records:
            raise ValueError(f"{self.name}: request id {request.request_id!r} reused")
        n_prompt = len(request.prompt_token_ids)
        if n_prompt < 1 or request.output_tokens < 1:
            raise ValueError(f"{request.request_id}: needs a prompt and >= 1 output token")
        if n_prompt + request.output_tokens > self.spec.max_model_len:
            raise ValueError(f"{request.request_id}: {n_prompt} prompt + "
                             f"{request.output_tokens} output tokens exceed max_model_len "
                             f"{self.spec.max_model_len} of {self.name}")
        now = self.clock()
        self._inbox.append(Request(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling_params=SamplingParams(
                max_tokens=request.output_tokens, ignore_eos=True,
                extra_args=request.retention.xargs() if request.retention else None),
            pooling_params=None,
            arrival_time=now,
            priority=request.priority,
            block_hasher=self._hasher,
        ))
        record = RequestRecord(request.request_id, self.name, n_prompt, request.output_tokens,
                               request.priority, arrival=now)
        self.records[request.request_id] = record
        return record

    def step(self) -> tuple[list[RequestRecord], float | None]:
        """Finish the running step (if any), then start the next one now.

        Returns the requests that finished and the new step's duration in seconds (None:
        nothing to run, the engine is idle)."""
        finished = self._finish_step() if self._running is not None else []
        for request in self._inbox:
            self.scheduler.add_request(request)
        self._inbox.clear()
        if not self.scheduler.has_requests():
            return finished, None
        out = self.scheduler.schedule()
        if not out.num_scheduled_tokens:  # EngineCore runs no model; vLLM forgets finished ids
            self.scheduler.update_from_output(out, fake_output(self.scheduler, out))
            self._set_metrics()
            if self.scheduler.get_num_unfinished_requests():
                raise RuntimeError(f"{self.name}: requests wait but nothing can be "
                                   "scheduled (a prompt larger than the KV cache?)")
            return finished, None
        self.steps += 1
        self.preemptions += len(out.preempted_req_ids or ())
        now = self.clock()
        decode_contexts: list[int] = []
        prefill_tokens, prefill_pairs = 0, 0.0
        for rid, n in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[rid]
            before = request.num_computed_tokens - n  # schedule() already advanced it
            record = self.records[rid]
            if record.first_scheduled is None:
                record.first_scheduled = now
                record.cached_tokens = before
            if n == 1 and before >= request.num_prompt_tokens:
                decode_contexts.append(before + 1)
            else:
                prefill_tokens += n
                prefill_pairs += n * (before + n / 2)
        self._running = (out, fake_output(self.scheduler, out))
        duration = self.step_time.step_ms(decode_contexts, prefill_tokens,
                                          prefill_pairs) / 1000.0
        self.busy_s += duration
        return finished, duration

    def _finish_step(self) -> list[RequestRecord]:
        assert self._running is not None
        out, model_output = self._running
        self._running = None
        now = self.clock()
        finished = []
        for eco in self.scheduler.update_from_output(out, model_output).values():
            for o in eco.outputs:
                record = self.records[o.request_id]
                if o.new_token_ids:
                    if record.first_token is None:
                        record.first_token = now
                        self._tokens += record.prompt_tokens
                    record.generated += len(o.new_token_ids)
                    self._tokens += len(o.new_token_ids)
                if o.finish_reason is not None:
                    record.finish = now
                    finished.append(record)
        self._set_metrics()
        return finished

    def _set_metrics(self) -> None:
        """vLLM's stats after ``update_from_output``: its own counts and KV usage."""
        running, waiting = self.scheduler.get_request_counts()
        self.metrics = VllmMetrics(running, waiting, self.scheduler.get_kv_cache_usage(),
                                   self.preemptions, self._tokens)
