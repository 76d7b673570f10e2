"""The facade end to end with no engine: batching collector, ZeroMQ subscription,
Chimera stickiness through the program table, decision statistics."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import msgspec
import pytest
import zmq

from engine_ext.telemetry import BlockStored, KVEventBatch
from router.dispatch.core import RouterCore
from router.policies.routebalance import AdaptiveWindow
from router.predictors.base import PredictorSet, QualityLength
from router.request import Workflow
from router.types import NoEngineAvailable, RoutingRequest
from tests.remote_cluster import remote_cluster
from tests.unit.test_state_engines import snap_frames

RB: dict[str, Any] = {"static_prior": True, "w_quality": 0.0, "w_cost": 0.0,
                      "w_latency": 1.0, "cost_per_token": {"a": 0.0},
                      "decode_ms_per_token": {"a": 10.0}, "max_batch": 4,
                      "max_window_ms": 50.0}


class Estimator:
    models = frozenset({"a"})

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.fail = fail

    async def estimate(self, reqs: Sequence[RoutingRequest]) -> Any:
        self.calls.append(len(reqs))
        if self.fail:
            raise RuntimeError("estimator crashed")
        return [{"a": QualityLength(0.5, 10.0)} for _ in reqs]


def core_for(policy: str, settings: dict[str, Any] | None = None,
             predictors: PredictorSet | None = None, engines: int = 2,
             endpoints: tuple[str, str] | None = None) -> RouterCore:
    cfg = remote_cluster(policy, {f"e{i}": "a" for i in range(engines)}, endpoints=endpoints,
                         policies={policy: settings or {}}, heartbeat_timeout_s=2.0)
    return RouterCore(cfg, predictors)


def window(core: RouterCore) -> AdaptiveWindow:
    policy = core.routing.policy
    assert policy is not None and isinstance(policy.window, AdaptiveWindow)
    return policy.window


def rr(rid: str, **wf: Any) -> RoutingRequest:
    return RoutingRequest(request_id=rid, requested_model=None, num_prompt_tokens=10,
                          max_tokens=10, workflow=Workflow(**wf))


async def _gather(core: RouterCore, n: int) -> list[Any]:
    return await asyncio.gather(*(core.routing.route(rr(f"r{i}")) for i in range(n)),
                                return_exceptions=True)


def test_route_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="start"):
        asyncio.run(core_for("round_robin").routing.route(rr("x")))


def test_concurrent_requests_form_one_batch() -> None:
    est = Estimator()
    core = core_for("routebalance", RB, PredictorSet(knn=est))
    core.build_policy()
    decisions = asyncio.run(_gather(core, 4))
    assert est.calls == [4]
    assert sorted(d.instance for d in decisions) == ["e0", "e0", "e1", "e1"]
    assert core.membership.stats.decisions[("routebalance", "a")] == 4
    assert core.membership.stats.decision_latency_s.count == 4
    assert len(core.state.ledger) == 4


def test_batches_are_capped_at_max_batch() -> None:
    est = Estimator()
    core = core_for("routebalance", RB, PredictorSet(knn=est))
    core.build_policy()
    asyncio.run(_gather(core, 9))
    assert est.calls == [4, 4, 1]


def test_a_predictor_failure_reaches_every_request_of_the_batch() -> None:
    core = core_for("routebalance", RB, PredictorSet(knn=Estimator(fail=True)))
    core.build_policy()
    results = asyncio.run(_gather(core, 3))
    assert all(isinstance(r, RuntimeError) for r in results) and len(core.state.ledger) == 0


class Picky(Estimator):
    """Raises for a batch holding ``boom``; gives ``bad`` a prediction for no model (the
    policy's batch decision then raises KeyError)."""

    async def estimate(self, reqs: Sequence[RoutingRequest]) -> Any:
        self.calls.append(len(reqs))
        if any(r.request_id == "boom" for r in reqs):
            raise RuntimeError("estimator crashed on boom")
        return [{} if r.request_id == "bad" else {"a": QualityLength(0.5, 10.0)}
                for r in reqs]


def test_a_bad_request_in_a_batch_fails_alone() -> None:
    est = Picky()
    core = core_for("routebalance", {**RB, "max_batch": 32}, PredictorSet(knn=est))
    core.build_policy()

    async def scenario() -> list[Any]:
        ids = [f"r{i}" for i in range(10)] + ["boom", "bad"] + [f"s{i}" for i in range(10)]
        return await asyncio.gather(*(core.routing.route(rr(i)) for i in ids),
                                    return_exceptions=True)

    results = asyncio.run(scenario())
    assert est.calls[0] == 22  # one batch, then one request at a time
    assert isinstance(results[10], RuntimeError) and isinstance(results[11], KeyError)
    good = results[:10] + results[12:]
    assert all(not isinstance(r, BaseException) for r in good), good
    assert len(core.state.ledger) == 20


def test_a_caller_that_leaves_during_the_window_is_not_accounted() -> None:
    est = Estimator()
    core = core_for("routebalance", RB, PredictorSet(knn=est))
    core.build_policy()
    window(core).gap_s = 0.001  # busy: the next batch waits for more arrivals

    async def scenario() -> None:
        leaving = asyncio.ensure_future(core.routing.route(rr("gone")))
        await asyncio.sleep(0)
        staying = asyncio.ensure_future(core.routing.route(rr("kept")))
        await asyncio.sleep(0)
        leaving.cancel()
        await staying
    asyncio.run(scenario())
    assert est.calls == [1] and set(core.state.ledger._records) == {"kept"}


def test_stop_fails_waiting_requests() -> None:
    core = core_for("routebalance", {**RB, "max_batch": 64, "max_window_ms": 1000.0},
                    PredictorSet(knn=Estimator()))
    core.build_policy()
    window(core).gap_s = 0.01  # window: 63 gaps = 0.63 s

    async def scenario() -> Any:
        waiting = asyncio.ensure_future(core.routing.route(rr("w")))
        await asyncio.sleep(0.01)
        await core.stop()
        return await asyncio.gather(waiting, return_exceptions=True)
    (result,) = asyncio.run(scenario())
    assert isinstance(result, NoEngineAvailable)


def test_chimera_program_sticks_through_the_core() -> None:
    settings = {"static_prior": True, "confidence": {"a": 0.5},
                "mean_output_tokens": {"a": 100}, "decode_ms_per_token": {"a": 10},
                "max_batch_size": {"a": 8}}
    core = core_for("chimera", settings)
    core.build_policy()
    d0 = asyncio.run(core.routing.route(rr("s0", program_id="p", stage_index=0, num_stages=2)))
    assert core.state.programs.model("p") == "a" and d0.priority == 200
    assert core.membership.engines()[0].inflight_predicted_tokens + \
        core.membership.engines()[1].inflight_predicted_tokens == 200
    core.routing.on_complete(d0, 90, None)
    d1 = asyncio.run(core.routing.route(rr("s1", program_id="p", stage_index=1, num_stages=2)))
    assert d1.info["sticky"] and d1.priority == 100 and d1.final
    core.routing.on_complete(d1, 90, None)
    assert "p" not in core.state.programs and len(core.state.ledger) == 0
    assert core.membership.stats.policy_sources == {"confidence": "static_prior",
                                         "remaining_tokens": "static_prior",
                                         "profile": "static_prior"}


def test_start_subscribes_tcp_by_binding_and_ipc_by_connecting(tmp_path: Any) -> None:
    with zmq.Context() as probe, probe.socket(zmq.REP) as s:
        port = s.bind_to_random_port("tcp://127.0.0.1")
    tele, kv = f"tcp://127.0.0.1:{port}", f"ipc://{tmp_path}/kv"
    core = core_for("round_robin", engines=1, endpoints=(tele, kv))
    batch = KVEventBatch(ts=0.0, events=[BlockStored(block_hashes=[7], parent_block_hash=None,
                                                     token_ids=[], block_size=4)])

    async def scenario() -> None:
        await core.start()
        ctx = zmq.Context()
        pub_t, pub_k = ctx.socket(zmq.PUB), ctx.socket(zmq.PUB)
        pub_t.connect(tele)   # engines connect to a tcp endpoint the router binds
        pub_k.bind(kv)        # and bind an ipc endpoint the router connects to
        try:
            for seq in range(200):
                pub_t.send_multipart(snap_frames("e0", seq, batch_size=2))
                pub_k.send_multipart([b"e0", seq.to_bytes(8, "big"),
                                      msgspec.msgpack.encode(batch)])
                await asyncio.sleep(0.01)
                counters = core.membership.stats.engines["e0"]
                if counters.snapshot_frames and counters.kv_frames:
                    break
        finally:
            pub_t.close(0)
            pub_k.close(0)
            ctx.term()
            await core.stop()
    asyncio.run(scenario())
    assert core.membership.engines()[0].batch_size == 2 and 7 in core.state.table["e0"].kv


def test_only_an_engine_placed_on_a_ray_node_may_move_to_another_host() -> None:
    """The launcher re-places a Ray engine on any node; a local one keeps its host."""
    core = core_for("round_robin")
    core.membership.nodes["e1"] = "10.0.0.5 (abcdef12)"
    with pytest.raises(ValueError, match="only its port may change"):
        core.membership.changes.move("e0", "http://10.0.0.9:8000")
    core.membership.changes.move("e0", "http://e0:8001")
    core.membership.changes.move("e1", "http://10.0.0.9:8000")
    assert core.state.table["e1"].url == "http://10.0.0.9:8000"
    for bad in ("http://10.0.0.9:8000/v1", "ftp://10.0.0.9:8000", "http://:8000"):
        with pytest.raises(ValueError, match="http://HOST:PORT"):
            core.membership.changes.move("e1", bad)
    for url, node in (("http://" + "h" * 1100 + ":1", None), ("http://h:1", "n" * 1025)):
        with pytest.raises(ValueError, match="too long"):  # more than a peer could take
            core.membership.changes.move("e1", url, node)
    assert core.state.table["e1"].url == "http://10.0.0.9:8000"
