"""``Routing``: a request's decision and its end (route, commit, complete).

It builds the configured policy, asks it for decisions (batched ones through
``collector``), records each in the shared ``ClusterState`` (in-flight ledger, program
table, counters) and releases it when the request ends. The other router workers hear of
each program's routing and completion (``router.dispatch.peers``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

from router.config.cluster import RouterConfig
from router.dispatch.collector import BatchCollector
from router.dispatch.health_probe import HealthProber
from router.dispatch.peers import Completed, Peers, Routed
from router.request import NEW_PROGRAM
from router.policies.affinity import keep_home
from router.policies.base import Policy
from router.policies.registry import build_policy
from router.predictors.base import PredictorSet
from router.state.cluster import ClusterState
from router.state.engines import EngineState
from router.state.inflight import InflightRecord
from router.state.view import Candidates, StateView, engine_view
from router.types import BatchWindow, ClusterInfo, Decision, NoEngineAvailable, RoutingRequest


@dataclasses.dataclass(frozen=True)
class _Failed:
    """A request's failed prediction, in its slot of a batch."""

    error: Exception


class Routing:
    """Decisions over the shared state; the policy only selects, this records."""

    def __init__(self, settings: RouterConfig, state: ClusterState, predictors: PredictorSet,
                 peers: Peers | None, prober: HealthProber,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """``peers``: the other router workers (None for a lone router); ``prober``: told
        of every engine that answered."""
        self.settings, self.state, self.predictors = settings, state, predictors
        self.peers, self.prober = peers, prober
        self.clock, self.wall_clock = clock, wall_clock
        self.policy: Policy[Any] | None = None
        self._batching: tuple[BatchWindow, BatchCollector] | None = None

    def build_policy(self) -> Policy[Any]:
        """Build the configured policy (ValueError: bad settings, missing predictor)."""
        cluster = ClusterInfo({n: e.model for n, e in self.state.table.engines.items()})
        self.policy = build_policy(self.settings.policy, self.settings.policies, cluster,
                                   self.predictors)
        window = self.policy.window
        if window is not None:
            self._batching = (window, BatchCollector(self._run_batch, window.max_batch,
                                                     window.window_s, self._abandon))
        self.state.stats.policy_sources = dict(self.policy.sources)
        return self.policy

    async def stop(self) -> None:
        """Fail the requests still waiting in a batching window."""
        if self._batching is not None:
            await self._batching[1].stop(NoEngineAvailable("the router is shutting down"))

    async def route(self, req: RoutingRequest) -> Decision:
        """Choose model and engine. NoEngineAvailable (503): nothing up for it;
        ValueError (400): a request no engine can take (unknown model, too long, budget)."""
        if self.policy is None:
            raise RuntimeError("RouterCore.start() (or build_policy()) was not called")
        t0 = self.clock()
        self.state.maintain(t0)
        self._eligible(req)  # fail fast, before any prediction
        if self._batching is not None:
            window, collector = self._batching
            window.arrival(t0)
            dec = await collector.submit(req)
        else:
            preds = await self._predict([req])
            now = self.clock()
            view = self.state.view()
            cands = self._candidates(req, now)
            dec = self._commit(req, self.policy.decide(req, cands, view, preds[0]), cands,
                               view, now)
        self.state.stats.decision_latency_s.observe(self.clock() - t0)
        return dec

    async def _run_batch(self, reqs: Sequence[RoutingRequest]) -> list[Decision | Exception]:
        """Decide a batch; a request whose prediction, candidates or decision fails gets
        its own exception and the others are decided as if it were not there."""
        assert self.policy is not None
        preds = await self._predict_each(reqs)
        now = self.clock()
        view = self.state.view()
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
        for i, c, res in zip(ok, cands, results):
            out[i] = self._commit(reqs[i], res, c, view, now) if isinstance(res, Decision) \
                else res
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
        self.state.stats.predictor_latency_s.observe(self.clock() - t0)
        return preds

    def _eligible(self, req: RoutingRequest) -> list[EngineState]:
        """Engines that could serve ``req`` and are up, in name order."""
        table = self.state.table
        model = req.requested_model
        if model is not None and model not in table.models:
            if model in table.served:  # its last engines were removed
                raise NoEngineAvailable(f"model '{model}' has no engine: every one was "
                                        "removed")
            raise ValueError(f"model '{model}' is not served here; served models: "
                             f"{', '.join(sorted(table.served))} (or 'auto')")
        engines = table.models[model] if model is not None else table.ordered
        if req.engine is not None:  # it continues a response this engine stored
            if req.engine not in table.engines:
                raise ValueError(f"engine '{req.engine}', which stored the response this "
                                 "call continues, was removed, and its stored responses "
                                 "with it; send the whole conversation instead")
            engine = table[req.engine]
            if engine.down_reason is not None:
                raise NoEngineAvailable(f"engine '{req.engine}', which stored the response "
                                        f"this call continues, is down ({engine.down_reason})")
            engines = [engine]
        if not engines:
            raise NoEngineAvailable("no engine: every one was removed")
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
        ledger = self.state.ledger
        return Candidates(self._eligible(req), lambda e: engine_view(e, ledger, now))

    def _commit(self, req: RoutingRequest, dec: Decision, cands: Candidates,
                view: StateView, now: float) -> Decision:
        """Record a decision (in-flight ledger, program table, counters), sent to its
        program's engine first where affinity applies (``router.policies.affinity``). A
        ``new`` program's first call enters no table: the call that joins it does
        (``ClusterState.join``)."""
        state, r = self.state, self.settings
        assert self.policy is not None
        if r.program_affinity and self.policy.program_affinity and dec.program_id is not None:
            dec = keep_home(req, dec, cands, view, r.affinity_abs_threshold,
                            r.affinity_rel_threshold)
        engine = state.table[dec.instance]
        cached = view.cached_tokens(req, dec.instance)
        max_tokens = dec.max_tokens or req.max_tokens
        if max_tokens is None:  # vLLM's default: the rest of the context
            max_tokens = (engine.max_model_len or req.num_prompt_tokens) - req.num_prompt_tokens
        state.ledger.add(InflightRecord(
            request_id=req.request_id, engine=dec.instance, model=dec.model,
            predicted_tokens=dec.predicted_remaining_tokens or 0.0,
            prefill_tokens=max(0, req.num_prompt_tokens - cached), decode_tokens=max_tokens,
            sent_wall=self.wall_clock()))
        if dec.program_id is not None and req.program_source != "new":
            home = state.programs.engine(dec.program_id)
            if home is not None and home != dec.instance:
                state.stats.program_moves[dec.info.get("affinity", "policy")] += 1
            state.programs.routed(dec.program_id, dec.model, now, dec.instance)
            if self.peers is not None and not local_program(dec.program_id):
                self.peers.publish(Routed(dec.program_id, dec.model, dec.instance))
        state.stats.decisions[(dec.policy, dec.model)] += 1
        state.open_requests[dec.instance] += 1
        return dataclasses.replace(dec, cached_tokens=cached)

    def _abandon(self, dec: Decision) -> None:
        self.state.ledger.release(dec.request_id)
        self.state.closed(dec.instance)

    def on_complete(self, decision: Decision, output_tokens: int | None,
                    error: str | None) -> None:
        """A routed request ended (completion, error, client disconnect or abort)."""
        state = self.state
        state.ledger.release(decision.request_id)
        state.closed(decision.instance)
        if error is None:
            self.prober.succeeded(decision.instance)
        if decision.program_id is not None:
            state.programs.completed(decision.program_id, decision.final, error is not None,
                                     self.clock())
            if self.peers is not None and not local_program(decision.program_id):
                self.peers.publish(Completed(decision.program_id, decision.final,
                                             error is not None))


def local_program(program_id: str) -> bool:
    """A program only this worker can find again (``new:``: its calls are found by the
    conversation or response they continue, which this worker alone remembers,
    ``router.state.conversations``): the other workers are not told of it."""
    return program_id.startswith(NEW_PROGRAM)
