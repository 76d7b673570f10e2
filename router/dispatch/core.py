"""``RouterCore``: the facade the HTTP front calls. All router state changes happen here.

It owns the engine table (telemetry), the KV prefix indices (KV events), the in-flight
ledger and the program table, subscribes to every engine's streams, asks the policy for
decisions and records them.

Configuration read (duck-typed ``router.config.cluster.ClusterConfig``):
``config.instances()`` (``name, served_model_name, url, telemetry_endpoint,
kv_events_endpoint, max_model_len``) and ``config.router``: ``policy``, ``policies``,
``heartbeat_timeout_s`` and, if present, ``program_ttl_s`` (default 600 s),
``kv_hash_algo`` (default ``sha256``) and ``kv_hash_seed`` (the engines'
``PYTHONHASHSEED`` if they set one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import msgspec
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from engine_ext.curve import router_curve
from engine_ext.telemetry import (KVEventBatch, SchedulerSnapshot, kv_event_decoder,
                                  snapshot_decoder)
from router.dispatch.collector import BatchCollector
from router.dispatch.health_probe import HealthProber
from router.config.engines import MAX_NODE_CHARS
from router.config.membership import with_engine, without_engine
from router.dispatch.peers import (MAX_ENTRY_CHARS, MAX_URL_CHARS, Added, Completed, Marked,
                                   Moved, PeerEvent, Peers, Removed, Routed, sync_endpoints)
from router.dispatch.subscriber import StreamSubscriber
from router.policies.base import Policy
from router.policies.registry import build_policy
from router.predictors.base import PredictorSet
from router.state.engines import EngineState, EngineTable
from router.state.inflight import InflightLedger, InflightRecord
from router.state.kv_hash import BlockHasher
from router.state.programs import ProgramTable
from router.state.stats import RouterStats, StreamCounters
from router.state.view import Candidates, EngineView, StateView, engine_view
from router.types import BatchWindow, ClusterInfo, Decision, NoEngineAvailable, RoutingRequest

DEFAULT_HEARTBEAT_TIMEOUT_S = 2.0
DEFAULT_PROGRAM_TTL_S = 600.0
EXPIRY_INTERVAL_S = 1.0
"""How often abandoned programs are looked for (on the request path)."""

log = logging.getLogger("hetserve.router")


@dataclasses.dataclass(frozen=True)
class _Failed:
    """A request's failed prediction, in its slot of a batch."""

    error: Exception


class RouterCore:
    def __init__(self, config: Any, predictors: PredictorSet | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, worker: int | None = None) -> None:
        """``worker``: this process's index among ``config.router.workers`` router
        processes serving one port (``router.dispatch.peers``); None for a lone router."""
        r = config.router
        self.config = config
        self.clock, self.wall_clock = clock, wall_clock
        self.predictors = predictors or PredictorSet()
        instances = list(config.instances())
        self.table = EngineTable(instances, getattr(r, "heartbeat_timeout_s", None)
                                 or DEFAULT_HEARTBEAT_TIMEOUT_S,
                                 getattr(r, "scheduler_stall_timeout_s", None) or 30.0)
        self.ledger = InflightLedger()
        self.programs = ProgramTable(getattr(r, "program_ttl_s", None) or DEFAULT_PROGRAM_TTL_S)
        self.hasher = BlockHasher(getattr(r, "kv_hash_algo", None) or "sha256",
                                  getattr(r, "kv_hash_seed", None))
        self._stats = RouterStats(engines={i.name: StreamCounters() for i in instances})
        self.nodes: dict[str, str | None] = {i.name: getattr(i, "node", None)
                                             for i in instances}
        """Where each engine runs, when the launcher placed it on a Ray node; such an
        engine may move to another host (``move_engine``)."""
        self.instances: dict[str, Any] = {i.name: i for i in instances}
        """The engine instances routed to (``config.instances()``, plus added ones)."""
        names = set(self.table.engines)  # the decoders' topics, grown by add_engine
        keys_dir = getattr(r, "telemetry_keys_dir", None)
        self.curve = router_curve(keys_dir) if keys_dir else None
        self.snapshots = StreamSubscriber(
            "snapshot", [i.telemetry_endpoint for i in instances if i.telemetry_endpoint],
            snapshot_decoder(names), self._on_snapshot, self.curve)
        self.kv_events = StreamSubscriber(
            "kv", [i.kv_events_endpoint for i in instances if i.kv_events_endpoint],
            kv_event_decoder(names), self._on_kv_batch, self.curve)
        self._names = names
        self.open_requests: Counter[str] = Counter()
        """Requests sent to each engine whose answer has not ended, whatever its marks
        (a down mark releases its load from the ledger, not its requests): what a
        drain waits for."""
        self._cleanup: set[asyncio.Task[None]] = set()
        """Unsubscribing from a removed engine's endpoints (a peer's removal)."""
        self._zap: AsyncioAuthenticator | None = None
        self.policy: Policy[Any] | None = None
        self._batching: tuple[BatchWindow, BatchCollector] | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._next_expiry = 0.0
        self.prober = HealthProber({i.name: i.url for i in instances},
                                   lambda name: self.mark_engine(name, True, "health probe"),
                                   backoff_s=getattr(r, "breaker_backoff_s", None) or 1.0,
                                   backoff_max_s=getattr(r, "breaker_backoff_max_s", None)
                                   or 30.0)
        self.peers = self._peers(r, worker)

    def _peers(self, r: Any, worker: int | None) -> Peers | None:
        workers = getattr(r, "workers", 1)
        if workers == 1:
            return None
        if worker is None or not getattr(r, "sync_dir", None) or r.port is None:
            raise ValueError(f"router.workers = {workers}: each process needs --worker I "
                             "(0..workers-1), router.port and router.sync_dir (the launcher "
                             "sets both)")
        return Peers(sync_endpoints(r.sync_dir, r.port, workers), worker, self._apply_peer)

    # ---- lifecycle ----

    def build_policy(self) -> Policy[Any]:
        """Build the configured policy (ValueError: bad settings, missing predictor)."""
        r = self.config.router
        cluster = ClusterInfo({n: e.model for n, e in self.table.engines.items()})
        self.policy = build_policy(r.policy, getattr(r, "policies", None) or {},
                                   cluster, self.predictors)
        window = self.policy.window
        if window is not None:
            self._batching = (window, BatchCollector(self._run_batch, window.max_batch,
                                                     window.window_s, self._abandon))
        self._stats.policy_sources = dict(self.policy.sources)
        return self.policy

    async def start(self) -> None:
        """Build the policy (unless built), then subscribe to every engine's telemetry
        and KV events."""
        if self.policy is None:
            self.build_policy()
        self._ctx = zmq.asyncio.Context()
        if self.curve is not None:  # ZAP: only the engines' key gets a connection
            self._zap = AsyncioAuthenticator(self._ctx, log=log)
            self._zap.start()
            self._zap.configure_curve_callback("*", self.curve)
        try:
            await self.snapshots.start(self._ctx)
            await self.kv_events.start(self._ctx)
            if self.peers is not None:
                await self.peers.start(self._ctx)
        except ValueError:
            await self.stop()
            raise
        await self.prober.start()

    async def stop(self) -> None:
        await self.prober.stop()
        if self._batching is not None:
            await self._batching[1].stop(NoEngineAvailable("the router is shutting down"))
        await self.snapshots.stop()
        await self.kv_events.stop()
        if self.peers is not None:
            await self.peers.stop()
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # ---- routing ----

    async def route(self, req: RoutingRequest) -> Decision:
        """Choose model and engine. NoEngineAvailable (503): nothing up for it;
        ValueError (400): a request no engine can take (unknown model, too long, budget)."""
        if self.policy is None:
            raise RuntimeError("RouterCore.start() (or build_policy()) was not called")
        t0 = self.clock()
        self._maintain(t0)
        self._eligible(req)  # fail fast, before any prediction
        if self._batching is not None:
            window, collector = self._batching
            window.arrival(t0)
            dec = await collector.submit(req)
        else:
            preds = await self._predict([req])
            now = self.clock()
            view = self._view()
            dec = self._commit(req, self.policy.decide(req, self._candidates(req, now), view,
                                                       preds[0]), view, now)
        self._stats.decision_latency_s.observe(self.clock() - t0)
        return dec

    async def _run_batch(self, reqs: Sequence[RoutingRequest]) -> list[Decision | Exception]:
        """Decide a batch; a request whose prediction, candidates or decision fails gets
        its own exception and the others are decided as if it were not there."""
        assert self.policy is not None
        preds = await self._predict_each(reqs)
        now = self.clock()
        view = self._view()
        out: dict[int, Decision | Exception] = {}
        ok: list[int] = []
        cands: list[Candidates] = []
        for i, req in enumerate(reqs):
            if isinstance(preds[i], _Failed):
                out[i] = preds[i].error
                continue
            try:
                cands.append(self._candidates(req, now))
                ok.append(i)
            except (ValueError, NoEngineAvailable) as exc:
                out[i] = exc
        results = self._decide_each([reqs[i] for i in ok], cands, view, [preds[i] for i in ok])
        for i, res in zip(ok, results):
            out[i] = self._commit(reqs[i], res, view, now) if isinstance(res, Decision) else res
        return [out[i] for i in range(len(reqs))]

    async def _predict_each(self, reqs: Sequence[RoutingRequest]) -> list[Any]:
        """Batched predictions; if the batch raises, one request at a time, a failure
        in its slot as ``_Failed``."""
        try:
            return await self._predict(reqs)
        except Exception as exc:
            if len(reqs) == 1:
                return [_Failed(exc)]
        out: list[Any] = []
        for req in reqs:
            out += await self._predict_each([req])
        return out

    def _decide_each(self, reqs: Sequence[RoutingRequest], cands: Sequence[Candidates],
                     view: StateView, preds: Sequence[Any]) -> list[Decision | Exception]:
        """The policy's batch decision; if it raises, each request decided alone, so
        the one that makes it raise gets the exception."""
        assert self.policy is not None
        try:
            return list(self.policy.decide_batch(reqs, cands, view, preds))
        except Exception as exc:
            if len(reqs) == 1:
                return [exc]
        return [res for r, c, p in zip(reqs, cands, preds)
                for res in self._decide_each([r], [c], view, [p])]

    async def _predict(self, reqs: Sequence[RoutingRequest]) -> list[Any]:
        assert self.policy is not None
        t0 = self.clock()
        preds = await self.policy.predict(reqs)
        self._stats.predictor_latency_s.observe(self.clock() - t0)
        return preds

    def _view(self) -> StateView:
        return StateView(self.table, self.ledger, self.programs, self.hasher)

    def _eligible(self, req: RoutingRequest) -> list[EngineState]:
        """Engines that could serve ``req`` and are up, in name order."""
        model = req.requested_model
        if model is not None and model not in self.table.models:
            raise ValueError(f"model '{model}' is not served here; served models: "
                             f"{', '.join(sorted(self.table.models))} (or 'auto')")
        engines = self.table.models[model] if model is not None else self.table.ordered
        need = req.num_prompt_tokens + (req.max_tokens or 1)
        fits = [e for e in engines if e.max_model_len is None or e.max_model_len >= need]
        if not fits:
            longest = max(e.max_model_len or 0 for e in engines)
            raise ValueError(
                f"{req.num_prompt_tokens} prompt tokens plus max_tokens {req.max_tokens or 1} "
                f"exceed the context of every engine{f' of {model}' if model else ''} "
                f"(largest {longest} tokens)")
        up = [e for e in fits if e.down_reason is None]
        if not up:
            reasons = "; ".join(f"{e.name}: {e.down_reason}" for e in fits)
            raise NoEngineAvailable(f"no engine for {model or 'auto'} is up ({reasons})")
        return up

    def _candidates(self, req: RoutingRequest, now: float) -> Candidates:
        return Candidates(self._eligible(req), lambda e: engine_view(e, self.ledger, now))

    def _commit(self, req: RoutingRequest, dec: Decision, view: StateView,
                now: float) -> Decision:
        """Record a decision (in-flight ledger, program table, counters)."""
        engine = self.table[dec.instance]
        cached = view.cached_tokens(req, dec.instance)
        max_tokens = dec.max_tokens or req.max_tokens
        if max_tokens is None:  # vLLM's default: the rest of the context
            max_tokens = (engine.max_model_len or req.num_prompt_tokens) - req.num_prompt_tokens
        self.ledger.add(InflightRecord(
            request_id=req.request_id, engine=dec.instance, model=dec.model,
            predicted_tokens=dec.predicted_remaining_tokens or 0.0,
            prefill_tokens=max(0, req.num_prompt_tokens - cached), decode_tokens=max_tokens,
            sent_wall=self.wall_clock()))
        if dec.program_id is not None:
            self.programs.routed(dec.program_id, dec.model, now)
            if self.peers is not None:
                self.peers.publish(Routed(dec.program_id, dec.model))
        self._stats.decisions[(dec.policy, dec.model)] += 1
        self.open_requests[dec.instance] += 1
        return dataclasses.replace(dec, cached_tokens=cached)

    def _closed(self, instance: str) -> None:
        self.open_requests[instance] -= 1
        if self.open_requests[instance] <= 0:
            del self.open_requests[instance]

    def _abandon(self, dec: Decision) -> None:
        self.ledger.release(dec.request_id)
        self._closed(dec.instance)

    # ---- completion and liveness ----

    def on_complete(self, decision: Decision, output_tokens: int | None,
                    error: str | None) -> None:
        """A routed request ended (completion, error, client disconnect or abort)."""
        self.ledger.release(decision.request_id)
        self._closed(decision.instance)
        if error is None:
            self.prober.succeeded(decision.instance)
        if decision.program_id is not None:
            self.programs.completed(decision.program_id, decision.final, error is not None,
                                    self.clock())
            if self.peers is not None:
                self.peers.publish(Completed(decision.program_id, decision.final,
                                             error is not None))

    def admin_mark(self, instance: str, up: bool, reason: str) -> None:
        """The launcher's or an operator's verdict on an engine: applied here and sent to
        the other router workers (ValueError: an unknown instance)."""
        self.mark_engine(instance, up, reason)
        if self.peers is not None:
            self.peers.publish(Marked(instance, up, reason))

    def admin_move(self, instance: str, url: str, node: str | None = None) -> None:
        """The launcher restarted ``instance`` on another port (same host; any host for an
        engine it placed on a Ray node): route to ``url`` from now on, here and in the
        other router workers (ValueError: an unknown instance, or a URL that is not
        ``http://<the same host>:PORT``). ``node``: its new Ray node."""
        self.move_engine(instance, url, node)
        if self.peers is not None:
            self.peers.publish(Moved(instance, url, node))

    def move_engine(self, instance: str, url: str, node: str | None = None) -> None:
        if instance not in self.table.engines:
            raise ValueError(f"unknown instance '{instance}'")
        old, new = urlsplit(self.table[instance].url), urlsplit(url)
        try:
            port = new.port
        except ValueError:
            port = None
        placed = self.nodes.get(instance) is not None
        if len(url) > MAX_URL_CHARS or (node is not None and len(node) > MAX_NODE_CHARS):
            raise ValueError(f"url (at most {MAX_URL_CHARS} characters) or node (at most "
                             f"{MAX_NODE_CHARS}) too long")
        if (new.scheme != "http" or not new.hostname or port is None
                or (new.hostname != old.hostname and not placed)
                or new.path.strip("/") or new.query or new.username or new.password):
            rule = ("http://HOST:PORT" if placed else f"http://{old.hostname}:PORT (the "
                    "engine's host; only its port may change)")
            raise ValueError(f"url must be {rule}, got {url[:200]!r}")
        if node is not None and not placed:
            raise ValueError(f"engine '{instance}' was not placed on a Ray node: no node")
        self.table[instance].url = self.prober.urls[instance] = url.rstrip("/")
        if node is not None:
            self.nodes[instance] = node
        log.warning("engine %s moved to %s%s", instance, url, f" on {node}" if node else "")

    def admin_add(self, entry: dict[str, Any]) -> Any:
        """The launcher started one more replica of a served model: validate its
        cluster-file ``entry`` (``router.config.membership.with_engine``; ConfigError, a
        ValueError) and route to it, here and in the other router workers; the new instance."""
        text = msgspec.json.encode(entry).decode()
        if len(text) > MAX_ENTRY_CHARS:  # the other workers could not take it
            raise ValueError(f"the entry is over {MAX_ENTRY_CHARS} characters as JSON")
        inst = self._add(entry)
        if self.peers is not None:
            self.peers.publish(Added(text))
        return inst

    def _add(self, entry: dict[str, Any]) -> Any:
        self.config = with_engine(self.config, entry)
        inst = next(i for i in self.config.instances() if i.name == entry["name"])
        model = inst.served_model_name
        like = self.table.models[model][0].name
        self.table.add(inst)
        self.instances[inst.name] = inst
        self._names.add(inst.name)
        self._stats.engines.setdefault(inst.name, StreamCounters())
        self.nodes[inst.name] = inst.node
        self.prober.urls[inst.name] = inst.url
        if self._ctx is not None:
            self.snapshots.add(inst.telemetry_endpoint)
            self.kv_events.add(inst.kv_events_endpoint)
        if self.policy is not None:
            self.policy.add_engine(inst.name, model, like)
        log.warning("engine %s added (%s at %s)", inst.name, model, inst.url)
        return inst

    async def admin_remove(self, instance: str) -> None:
        """The launcher drained ``instance`` (marked down, nothing in flight) and stops
        it: forget it here and in the other router workers (ValueError: not marked down,
        requests still in flight, or not removable: ``without_engine``)."""
        unused = self._remove(instance)
        if self.peers is not None:
            self.peers.publish(Removed(instance))
        await self._unsubscribe(unused)

    def _remove(self, instance: str) -> list[tuple[StreamSubscriber, str]]:
        """Forget ``instance``; the endpoints no other engine uses, to unsubscribe."""
        e = self.table.engines.get(instance)
        if e is None:
            raise ValueError(f"unknown instance '{instance}'")
        if e.marked_down is None:
            raise ValueError(f"mark '{instance}' down first (POST .../down), then remove it "
                             "once nothing is in flight")
        inflight = self.open_requests[instance]
        if inflight:
            raise ValueError(f"'{instance}' still has {inflight} request(s) in flight")
        self.config = without_engine(self.config, instance)
        inst = self.instances.pop(instance)
        self.table.remove(instance)
        self._names.discard(instance)
        self.nodes.pop(instance, None)
        self.prober.urls.pop(instance, None)
        self.prober.forget(instance)
        if self.policy is not None:
            self.policy.remove_engine(instance)
        log.warning("engine %s removed", instance)
        used = {ep for i in self.instances.values()
                for ep in (i.telemetry_endpoint, i.kv_events_endpoint)}
        return [(sub, ep) for sub, ep in ((self.snapshots, inst.telemetry_endpoint),
                                          (self.kv_events, inst.kv_events_endpoint))
                if ep not in used]

    @staticmethod
    async def _unsubscribe(unused: list[tuple[StreamSubscriber, str]]) -> None:
        for sub, ep in unused:
            await sub.remove(ep)

    def _apply_peer(self, event: PeerEvent) -> None:
        """A change another router worker made (ValueError: one naming what is not here)."""
        now = self.clock()
        if isinstance(event, Added):
            entry = msgspec.json.decode(event.entry)
            if not isinstance(entry, dict):  # refused like any bad entry: a ValueError
                raise ValueError("an added engine's entry must be a JSON object")  # noqa: TRY004
            self._add(entry)
        elif isinstance(event, Removed):
            unused = self._remove(event.instance)
            self._cleanup.add(task := asyncio.get_running_loop().create_task(
                self._unsubscribe(unused)))
            task.add_done_callback(self._cleanup.discard)
        elif isinstance(event, Moved):
            self.move_engine(event.instance, event.url, event.node)
        elif isinstance(event, Marked):
            self.mark_engine(event.instance, event.up, event.reason)
        elif isinstance(event, Routed):
            if not any(e.model == event.model for e in self.table.engines.values()):
                raise ValueError(f"unknown model {event.model!r}")
            self.programs.routed(event.program_id, event.model, now)
        else:
            self.programs.completed(event.program_id, event.final, event.error, now)

    def mark_engine(self, instance: str, up: bool, reason: str, probe: bool = False) -> None:
        """Mark an engine down or back up. ``probe=True`` (a failed HTTP call): the
        health prober marks it up once it answers ``/health``; otherwise (launcher,
        operator) only an explicit mark brings it back."""
        if instance not in self.table.engines:
            raise ValueError(f"unknown instance '{instance}'")
        if up or not probe:
            self.prober.forget(instance)
        else:
            self.prober.watch(instance)
        if self.table.mark(instance, up, reason):
            self._stats.engine_down_events += 1
        if not up:
            self.ledger.release_engine(instance)

    def engines(self) -> list[EngineView]:
        now = self.clock()
        self._maintain(now)
        return [engine_view(e, self.ledger, now) for e in self.table.engines.values()]

    @property
    def stats(self) -> RouterStats:
        """Counters, with the subscribers' dropped-frame counts brought up to date."""
        st, snap, kv = self._stats, self.snapshots, self.kv_events
        st.malformed_snapshot_frames = snap.decoder.malformed
        st.malformed_kv_frames = kv.decoder.malformed
        st.unknown_topic_frames = snap.decoder.unknown_topic + kv.decoder.unknown_topic
        st.out_of_order_snapshot_frames = sum(
            s.out_of_order for s in snap.decoder.stats.values())
        st.out_of_order_kv_frames = sum(s.out_of_order for s in kv.decoder.stats.values())
        st.failed_snapshot_frames, st.failed_kv_frames = snap.errors, kv.errors
        return st

    def _maintain(self, now: float) -> None:
        for name in self.table.refresh(now):
            self.ledger.release_engine(name)
            self._stats.engine_down_events += 1
        if now >= self._next_expiry:
            self._next_expiry = now + EXPIRY_INTERVAL_S
            self._stats.programs_expired += len(self.programs.expire(now))

    # ---- telemetry ----

    # The decoders pass only well-formed frames of configured engines (a snapshot's
    # engine_id is its topic) that the sequence rule accepts (engine_ext.telemetry).

    def _on_snapshot(self, topic: str, seq: int, snap: SchedulerSnapshot) -> None:
        if self.table.on_snapshot(snap, self.clock()):
            log.warning("engine %s is down: %s", snap.engine_id,
                        self.table[snap.engine_id].down_reason)
            self._stats.engine_down_events += 1
        if snap.finished:
            self.ledger.finished(topic, [f.request_id for f in snap.finished])
        self.ledger.mark_reported(topic, snap.ts)
        counters, seqs = self._stats.engines[topic], self.snapshots.decoder.stats[topic]
        counters.snapshot_frames += 1
        counters.snapshot_gaps, counters.snapshot_resyncs = seqs.gaps, seqs.resyncs

    def _on_kv_batch(self, topic: str, seq: int, batch: KVEventBatch) -> None:
        self.table.on_kv_batch(topic, seq, batch)
        counters, seqs = self._stats.engines[topic], self.kv_events.decoder.stats[topic]
        counters.kv_frames += 1
        counters.kv_gaps, counters.kv_resyncs = seqs.gaps, seqs.resyncs
