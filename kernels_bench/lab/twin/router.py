"""The twin's router: the real front and core on the virtual clock, fed by engine twins.

``TwinRouter`` holds a ``router.app.Front`` whose ``RouterCore`` runs on the simulator's
clock, and takes the place of the HTTP route and the upstream: a chat body goes through
the front's ``admission.admit`` (validation, tokenization) and ``proxy.route`` (policy,
predictors, router state), then to the chosen engine twin with the priority and length
``router.proxy.engine_settings`` gives it and the KV retention hint of
``router.proxy.retention_for`` (what ``upstream_body`` puts in ``vllm_xargs``); the core
hears of the call's end through ``routing.on_complete``, as after a real stream. The
frames the engine twins make go through the core's own subscribers
(``StreamSubscriber.feed``: decoders, sequence checks, state updates); idle engines
send heartbeats as the engines' publisher does. A stock vLLM engine (``EngineSpec.stock``)
sends no snapshots: every ``scrape_interval_s`` of virtual time the
router reads its ``/metrics`` (``EngineTwin.metrics``, with no delay) and makes the
snapshot ``router.state.vllm_metrics.stock_snapshot`` makes of it, with its own ledger's
estimates, fed to the same subscriber.

Not run: HTTP, SSE relaying and the engines' API servers (their tokenization,
detokenization and streaming), modelled as a fixed ``request_overhead_s`` per call. The
router's own work on a call (tokenizing, predicting, deciding) is measured in wall time and
charged to the virtual clock when ``charge_decision`` is on (then a run is no longer
bit-for-bit repeatable).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from engine_ext.telemetry import DEFAULT_HEARTBEAT_S, encode_snapshot
from kernels_bench.lab.replay.client import CallResult
from kernels_bench.lab.twin.engine import EngineTwin
from kernels_bench.lab.twin.loop import VirtualLoop
from kernels_bench.lab.twin.request import RequestRecord, TwinRequest
from kernels_bench.lab.twin.telemetry import Frame, frame
from router.app import Front
from router.config.engines import priority_wire
from router.dispatch.core import RouterCore
from router.predictors.base import PredictorSet
from router.proxy import engine_settings, retention_for
from router.request import ParsedRequest, RequestError
from router.state.vllm_metrics import stock_snapshot
from router.types import RoutingRequest
from scheduler_patches.contract import NO_PRIORITY

DEFAULT_SCRAPE_INTERVAL_S = 0.1
"""How often the router reads a stock engine's ``/metrics`` unless told (100 ms)."""


@dataclass(frozen=True)
class RouterCosts:
    """What the twin charges to the virtual clock per call, before the engine sees it."""

    charge_decision: bool = True
    """The router's measured wall time on the call (admission and routing)."""
    request_overhead_s: float = 0.0
    """A fixed cost per call: HTTP, the engine API server's tokenization and streaming."""


class TwinRouter:
    """The router of a twin run; ``send`` is the replay client's ``Sender``."""

    def __init__(self, config: Any, loop: VirtualLoop, predictors: PredictorSet | None,
                 costs: RouterCosts | None = None,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S) -> None:
        """``config``: the run's ``ClusterConfig`` (its router settings and engines);
        ``loop.sim``: the engine twins, one per engine instance, telemetry on;
        ``scrape_interval_s``: between two scrapes of the stock engines."""
        self.loop, self.sim = loop, loop.sim
        core = RouterCore(config, predictors, clock=self.sim.now, wall_clock=self.sim.now)
        self.front = Front(config, core)
        ids = itertools.count(1)
        self.front.admission.new_request_id = lambda: f"t{next(ids)}"
        self.front.prepare()
        self.core = core
        self.costs = costs or RouterCosts()
        self.heartbeat_s = heartbeat_s
        self.scrape_interval_s = scrape_interval_s
        self._stock = [t for t in self.sim.engines.values() if t.spec.stock]
        self._scrape_seq = 0
        self.decision_s: list[float] = []
        """Measured router wall time per routed call."""
        self._waiting: dict[str, asyncio.Future[RequestRecord]] = {}
        self.sim.on_telemetry(self._telemetry)
        self.sim.on_finish(self._finished)

    def start(self) -> None:
        """Hand on the engines' first snapshots and start the heartbeats (in the loop)."""
        for twin in self.sim.engines.values():
            self.sim.hand_on(twin)
        self._beat()
        if self._stock:
            self._scrape()

    def _beat(self) -> None:
        for twin in self.sim.engines.values():
            if not twin.busy and twin.snapshots is not None:
                twin.snapshots.heartbeat(self.heartbeat_s)
                self.sim.hand_on(twin)
        self.loop.call_later(self.heartbeat_s / 4, self._beat)

    def _scrape(self) -> None:
        """Every stock engine's ``/metrics`` now, as the router's snapshot of it."""
        ledger, subscriber = self.core.state.ledger, self.core.membership.snapshots
        for twin in self._stock:
            snap = stock_snapshot(twin.name, self._scrape_seq, self.sim.now(), twin.metrics,
                                  ledger.load(twin.name))
            subscriber.feed(list(frame(twin.name, snap.seq, encode_snapshot(snap))))
        self._scrape_seq += 1
        self.loop.call_later(self.scrape_interval_s, self._scrape)

    def _telemetry(self, twin: EngineTwin, snaps: list[Frame], kv: list[Frame]) -> None:
        for f in snaps:
            self.core.membership.snapshots.feed(list(f))
        for f in kv:
            self.core.membership.kv_events.feed(list(f))

    def _finished(self, record: RequestRecord) -> None:
        future = self._waiting.pop(record.request_id, None)
        if future is not None and not future.done():
            future.set_result(record)

    async def send(self, body: dict[str, Any]) -> CallResult:
        """One chat call through the router to an engine twin (the replay's ``Sender``)."""
        res = CallResult()
        wall0, engine0 = time.perf_counter(), self.loop.engine_wall_s
        try:
            raw = msgspec.json.encode(body)
            parsed, routing = await self.front.admission.admit("chat", {}, lambda: _given(raw))
            decision = await self.front.proxy.route(routing)
        except RequestError as exc:
            res.error = f"HTTP {exc.status}: {exc.message}"
            res.end_s = self.sim.now()
            return res
        spent = time.perf_counter() - wall0 - (self.loop.engine_wall_s - engine0)
        self.decision_s.append(spent)
        res.model, res.engine = decision.model, decision.instance
        res.predicted_remaining_tokens = decision.predicted_remaining_tokens
        twin = self.sim.engines[decision.instance]
        priority, max_tokens = engine_settings(  # as live
            parsed, decision,
            priority_wire("vllm" if twin.spec.stock else "hetserve", twin.spec.sched_policy))
        res.priority = priority
        prompt = await self._engine_prompt(parsed, routing, decision.model)
        delay = (spent if self.costs.charge_decision else 0.0) + self.costs.request_overhead_s
        if delay > 0:
            await asyncio.sleep(delay)
        request = TwinRequest(routing.request_id, prompt,
                              max_tokens or twin.spec.max_model_len - len(prompt),
                              NO_PRIORITY if priority is None else priority,
                              retention_for(parsed.workflow))
        future: asyncio.Future[RequestRecord] = self.loop.create_future()
        try:
            self.sim.receive(decision.instance, request)
        except ValueError as exc:
            self.core.routing.on_complete(decision, 0, str(exc))
            res.error = f"engine {decision.instance} refused the call: {exc}"
            res.end_s = self.sim.now()
            return res
        self._waiting[routing.request_id] = future
        record = await future
        self.core.routing.on_complete(decision, record.generated, None)
        res.output_tokens, res.prompt_tokens = record.generated, record.prompt_tokens
        res.cached_tokens = record.cached_tokens
        res.first_token_s, res.end_s = record.first_token, self.sim.now()
        res.queue_s = record.queue_s
        return res

    async def _engine_prompt(self, parsed: ParsedRequest, routing: RoutingRequest,
                             model: str) -> tuple[int, ...]:
        """The prompt token ids the chosen model's engine computes: the router's own when
        it tokenized with the same tokenizer, else the chosen model's rendering."""
        tokenizers = self.front.tokenizers
        used = parsed.model or next(iter(self.front.models))
        if routing.prompt_token_ids and tokenizers.same_tokenizer([used, model]):
            return tuple(routing.prompt_token_ids)
        return tuple((await tokenizers.prompt(model, parsed)).token_ids)


async def _given(raw: bytes) -> bytes:
    """A body already in hand, as ``Admission.admit`` reads one."""
    return raw
