"""The twin's router: the real front and core on the virtual clock, fed by engine twins.

``TwinRouter`` holds a ``router.app.Front`` whose ``RouterCore`` runs on the simulator's
clock and takes every call through the front's own request path (``Front.handle``:
admission, the policy, the proxy), as the HTTP route hands it on. It plugs the engine
twins into the router's two seams to engines:

- the engine client (``router.engine_client``): the proxy's ``EngineCall`` (the priority
  and length ``router.proxy.engine_settings`` gave it, the KV retention hint in its body's
  ``vllm_xargs``, read as the engine does) goes to the chosen engine twin; the reply is
  the engine's usage, from which the proxy reports the call's end to the core;
- the telemetry source (``router.telemetry_source``): the frames the engine twins make go
  to the core's sink (decoders, sequence checks, state updates); idle engines send
  heartbeats as the engines' publisher does. A stock vLLM engine (``EngineSpec.stock``;
  ``kind = "vllm"`` in the router's cluster) sends no snapshots: every
  ``scrape_interval_s`` of virtual time its ``/metrics`` reading (``EngineTwin.metrics``,
  with no delay) is handed to the sink as a scrape's.

Not run: HTTP, SSE relaying (a call is sent unstreamed) and the engines' API servers
(their tokenization, detokenization and streaming), modelled as a fixed
``request_overhead_s`` per call. The router's own work on a call (tokenizing, predicting,
deciding) is measured in wall time and charged to the virtual clock when
``charge_decision`` is on (then a run is no longer bit-for-bit repeatable).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import msgspec

from engine_ext.telemetry import DEFAULT_HEARTBEAT_S
from kernels_bench.lab.replay.client import CallResult
from kernels_bench.lab.twin.engine import EngineTwin
from kernels_bench.lab.twin.loop import VirtualLoop
from kernels_bench.lab.twin.request import RequestRecord, TwinRequest
from kernels_bench.lab.twin.telemetry import Frame
from router.app import Front
from router.config.cluster import ClusterConfig
from router.config.engines import HETSERVE_ONLY_KEYS, EngineConfig
from router.dispatch.core import RouterCore
from router.engine_client import EngineCall, StreamResult
from router.predictors.base import PredictorSet
from router.request import RequestError
from router.telemetry_source import TelemetrySink
from scheduler_patches.contract import NO_PRIORITY, XARGS_FIELD, retention_hint

_STREAM_KEYS = ("stream", "stream_options")
"""Taken off the client's body: the twin relays no SSE, its calls are answered whole."""

DEFAULT_SCRAPE_INTERVAL_S = 0.1
"""How often the router reads a stock engine's ``/metrics`` unless told (100 ms)."""


@dataclass(frozen=True)
class RouterCosts:
    """What the twin charges to the virtual clock per call, before the engine sees it."""

    charge_decision: bool = True
    """The router's measured wall time on the call (admission and routing)."""
    request_overhead_s: float = 0.0
    """A fixed cost per call: HTTP, the engine API server's tokenization and streaming."""


@dataclass
class _Call:
    """One client call on its way through the router (the sending task's)."""

    result: CallResult
    wall0: float
    """Wall time when the call reached the router."""
    engine0: float
    """The loop's engine simulation wall time then."""


_call: ContextVar[_Call] = ContextVar("twin call")
"""The call of the task that sent it: ``Front.handle`` runs the engine client's ``send``
in that task, which records the router's answer into the call's result."""


class TwinRouter:
    """The router of a twin run; ``send`` is the replay client's ``Sender``."""

    def __init__(self, config: ClusterConfig, loop: VirtualLoop,
                 predictors: PredictorSet | None, costs: RouterCosts | None = None,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S) -> None:
        """``config``: the run's ``ClusterConfig`` (its router settings and engines);
        ``loop.sim``: the engine twins, one per engine instance, telemetry on;
        ``scrape_interval_s``: between two scrapes of the stock engines."""
        self.loop, self.sim = loop, loop.sim
        stock = [t for t in self.sim.engines.values() if t.spec.stock]
        config = _served(config, {t.spec.entry for t in stock})
        self.telemetry = TwinTelemetry(loop, stock, heartbeat_s, scrape_interval_s)
        self.engines = TwinEngines(loop, costs or RouterCosts(), self._engine_prompt)
        self.core = RouterCore(config, predictors, clock=self.sim.now,
                               wall_clock=self.sim.now, telemetry=self.telemetry)
        ids = itertools.count(1)
        self.front = Front(config, self.core, engine_client=self.engines,
                           request_ids=lambda: f"t{next(ids)}")

    @property
    def decision_s(self) -> list[float]:
        """Measured router wall time per routed call."""
        return self.engines.decision_s

    async def start(self) -> None:
        """The front started: tokenizers, policy, the core and its telemetry."""
        await self.front.start()

    async def stop(self) -> None:
        await self.front.stop()

    async def send(self, body: dict[str, Any]) -> CallResult:
        """One chat call through the router to an engine twin (the replay's ``Sender``)."""
        res = CallResult()
        _call.set(_Call(res, time.perf_counter(), self.loop.engine_wall_s))
        raw = msgspec.json.encode({k: v for k, v in body.items() if k not in _STREAM_KEYS})
        try:
            answer = await self.front.handle("chat", {}, lambda: _given(raw))
        except RequestError as exc:
            res.error = f"HTTP {exc.status}: {exc.message}"
        else:
            if answer.status != 200:
                res.error = f"engine {res.engine} refused the call: {_message(answer)}"
        res.end_s = self.sim.now()
        return res

    async def _engine_prompt(self, call: EngineCall) -> tuple[int, ...]:
        """The prompt token ids the chosen model's engine computes: the router's own when
        it tokenized with the same tokenizer, else the chosen model's rendering."""
        tokenizers, model = self.front.tokenizers, call.decision.model
        used = call.parsed.model or next(iter(self.front.models))
        if call.request.prompt_token_ids and tokenizers.same_tokenizer([used, model]):
            return tuple(call.request.prompt_token_ids)
        return tuple((await tokenizers.prompt(model, call.parsed)).token_ids)


class TwinTelemetry:
    """The engine twins as the router's ``TelemetrySource``."""

    def __init__(self, loop: VirtualLoop, stock: list[EngineTwin], heartbeat_s: float,
                 scrape_interval_s: float) -> None:
        self.loop, self.sim, self.stock = loop, loop.sim, stock
        self.heartbeat_s, self.scrape_interval_s = heartbeat_s, scrape_interval_s
        self._scrape_seq = 0
        self._sink: TelemetrySink | None = None
        self._timers: list[asyncio.TimerHandle] = []

    async def start(self, sink: TelemetrySink) -> None:
        """Hand on the engines' first snapshots, start the heartbeats and scrapes."""
        self._sink = sink
        self.sim.on_telemetry(self._frames)
        for twin in self.sim.engines.values():
            self.sim.hand_on(twin)
        self._beat()
        if self.stock:
            self._scrape()

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._sink = None

    def _later(self, delay_s: float, action: Callable[[], None]) -> None:
        self._timers = [t for t in self._timers if not t.cancelled()]
        self._timers.append(self.loop.call_later(delay_s, action))

    def _beat(self) -> None:
        for twin in self.sim.engines.values():
            if not twin.busy and twin.snapshots is not None:
                twin.snapshots.heartbeat(self.heartbeat_s)
                self.sim.hand_on(twin)
        self._later(self.heartbeat_s / 4, self._beat)

    def _scrape(self) -> None:
        """Every stock engine's ``/metrics`` now, handed on as a scrape's reading."""
        assert self._sink is not None
        for twin in self.stock:
            self._sink.scraped(twin.name, self._scrape_seq, self.sim.now(), twin.metrics)
        self._scrape_seq += 1
        self._later(self.scrape_interval_s, self._scrape)

    def _frames(self, twin: EngineTwin, snaps: list[Frame], kv: list[Frame]) -> None:
        if self._sink is None:
            return
        for f in snaps:
            self._sink.snapshot_frames(list(f))
        for f in kv:
            self._sink.kv_event_frames(list(f))


class TwinEngines:
    """The engine twins as the router's ``EngineClient``: a call's prompt, length,
    priority and retention hint (from its body's ``vllm_xargs``, as the engine reads it)
    submitted to its engine twin, after the costs charged before it."""

    def __init__(self, loop: VirtualLoop, costs: RouterCosts,
                 prompt: Callable[[EngineCall], Awaitable[tuple[int, ...]]]) -> None:
        """``prompt``: the prompt token ids of a call's engine."""
        self.loop, self.sim, self.costs, self._prompt = loop, loop.sim, costs, prompt
        self.decision_s: list[float] = []
        """Measured router wall time per routed call."""
        self._waiting: dict[str, asyncio.Future[RequestRecord]] = {}
        self.sim.on_finish(self._finished)

    async def send(self, call: EngineCall) -> TwinReply:
        c = _call.get()
        spent = time.perf_counter() - c.wall0 - (self.loop.engine_wall_s - c.engine0)
        self.decision_s.append(spent)
        res, decision = c.result, call.decision
        res.model, res.engine = decision.model, decision.instance
        res.predicted_remaining_tokens = decision.predicted_remaining_tokens
        res.priority = call.priority
        twin = self.sim.engines[decision.instance]
        prompt = await self._prompt(call)
        delay = (spent if self.costs.charge_decision else 0.0) + self.costs.request_overhead_s
        if delay > 0:
            await asyncio.sleep(delay)
        rid = call.request.request_id
        try:
            hint = retention_hint(msgspec.json.decode(call.body).get(XARGS_FIELD))
            self.sim.receive(decision.instance, TwinRequest(
                rid, prompt, call.max_tokens or twin.spec.max_model_len - len(prompt),
                NO_PRIORITY if call.priority is None else call.priority, hint))
        except ValueError as exc:  # the engine's API server's 400
            return TwinReply(400, msgspec.json.encode({"error": {"message": str(exc)}}))
        future: asyncio.Future[RequestRecord] = self.loop.create_future()
        self._waiting[rid] = future
        return TwinReply(200, b"", res, future, lambda: self._waiting.pop(rid, None))

    async def aclose(self) -> None:
        """Nothing held."""

    def _finished(self, record: RequestRecord) -> None:
        future = self._waiting.pop(record.request_id, None)
        if future is not None and not future.done():
            future.set_result(record)


class TwinReply:
    """An engine twin's answer (an ``EngineReply``): a refusal's body, or the engine's
    usage once its request finishes, its times recorded into the call's result."""

    content_type = "application/json"

    def __init__(self, status: int, body: bytes, result: CallResult | None = None,
                 future: asyncio.Future[RequestRecord] | None = None,
                 forget: Callable[[], object] | None = None) -> None:
        self.status, self._body, self._result = status, body, result
        self._future, self._forget = future, forget

    async def read(self) -> bytes:
        if self._future is None or self._result is None:
            return self._body
        record, res = await self._future, self._result
        res.output_tokens, res.prompt_tokens = record.generated, record.prompt_tokens
        res.cached_tokens = record.cached_tokens
        res.first_token_s, res.queue_s = record.first_token, record.queue_s
        return msgspec.json.encode({"usage": {"completion_tokens": record.generated,
                                              "prompt_tokens": record.prompt_tokens}})

    def events(self, result: StreamResult, keep_usage: bool) -> AsyncIterator[bytes]:
        raise NotImplementedError("the twin's client does not stream")

    def cancel(self) -> None:
        """Nobody waits for the answer any more (the engine twin runs it to its end)."""
        if self._forget is not None:
            self._forget()


def _served(config: ClusterConfig, stock: set[str]) -> ClusterConfig:
    """The cluster as the router is told it: the ``stock`` entries stock vLLM servers
    (``kind = "vllm"``: scraped, with their priority wire), without hetserve's keys."""
    def as_stock(e: EngineConfig) -> EngineConfig:
        return dataclasses.replace(e, kind="vllm", telemetry_endpoint=None,
                                   **{k: None for k in HETSERVE_ONLY_KEYS
                                      if k != "telemetry_endpoint"})
    return dataclasses.replace(config, engines=[
        as_stock(e) if e.name in stock and e.kind != "vllm" else e for e in config.engines])


def _message(answer: Any) -> str:
    return msgspec.json.decode(answer.body)["error"]["message"]


async def _given(raw: bytes) -> bytes:
    """A body already in hand, as admission reads one."""
    return raw
