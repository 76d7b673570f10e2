"""Policy interface, settings validation, registry, predictor resolution; and ``World``,
a small real router state (engine table, ledger, programs, KV index) the policy tests
share."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from types import SimpleNamespace
from typing import Any, Sequence

import pytest

from engine_ext.telemetry import BlockStored, KVEventBatch, SchedulerSnapshot
import router.policies
from router.policies import POLICIES, validate_settings
from router.policies.base import Policy, models_of, of_model, priority_for
from router.policies.registry import build_policy
from router.predictors.base import PredictorSet
from router.state.engines import EngineTable
from router.state.inflight import InflightLedger, InflightRecord
from router.state.kv_hash import BlockHasher
from router.state.programs import ProgramTable
from router.state.view import Candidates, EngineView, StateView, engine_view
from router.request import Workflow
from router.types import ClusterInfo, Decision, RoutingRequest
from scheduler_patches.contract import PRIORITY_MAX

BLOCK = 4
"""Block size of the test engines: small enough to hand-compute cached tokens."""


class World:
    """Engines with hand-set snapshots and caches, viewed as a policy sees them."""

    def __init__(self, engines: dict[str, str], max_model_len: int | None = None) -> None:
        self.instances = [SimpleNamespace(name=n, served_model_name=m, url=f"http://{n}",
                                          max_model_len=max_model_len)
                          for n, m in engines.items()]
        self.table = EngineTable(self.instances, heartbeat_timeout_s=2.0)
        self.ledger = InflightLedger()
        self.programs = ProgramTable(ttl_s=300)
        self.hasher = BlockHasher()
        self.now = 100.0
        self._seq: dict[str, int] = {}
        self.cluster = ClusterInfo(engines)

    def load(self, name: str, batch: int = 0, waiting: int = 0, prefill: int = 0,
             decode: int = 0, kv: float = 0.0) -> None:
        seq = self._seq[name] = self._seq.get(name, -1) + 1
        self.table.on_snapshot(SchedulerSnapshot(
            engine_id=name, seq=seq, ts=0.0, step=seq, batch_size=batch, num_waiting=waiting,
            queued_prefill_tokens=prefill, pending_decode_tokens=decode, kv_usage=kv,
            num_preemptions=0), self.now)

    def cache(self, name: str, tokens: Sequence[int]) -> None:
        hashes = self.hasher.block_hashes(tokens, BLOCK)
        n = len(hashes) * BLOCK
        self.table.on_kv_batch(name, 1, KVEventBatch(ts=0.0, events=[BlockStored(
            block_hashes=list[int | bytes](hashes), parent_block_hash=None,
            token_ids=list(tokens[:n]), block_size=BLOCK)]))

    def inflight(self, name: str, model: str, predicted: float, rid: str) -> None:
        self.ledger.add(InflightRecord(rid, name, model, predicted, 0, 0, sent_wall=0.0,
                                       reported=False))
        self.ledger.mark_reported(name, 1.0)

    def view(self) -> StateView:
        return StateView(self.table, self.ledger, self.programs, self.hasher)

    def cands(self, model: str | None = None) -> list[EngineView]:
        return [engine_view(e, self.ledger, self.now) for n, e in sorted(
            self.table.engines.items()) if model is None or e.model == model]

    def build(self, name: str, settings: dict[str, Any] | None = None,
              predictors: PredictorSet | None = None,
              others: dict[str, dict[str, Any]] | None = None) -> Any:
        return build_policy(name, {name: settings or {}, **(others or {})}, self.cluster,
                            predictors or PredictorSet())

    def decide(self, policy: Any, req: RoutingRequest, model: str | None = None) -> Decision:
        pred = asyncio.run(policy.predict([req]))[0]
        return policy.decide(req, self.cands(model), self.view(), pred)


def req(rid: str = "r", tokens: Sequence[int] = (), model: str | None = None,
        max_tokens: int | None = None, **workflow: Any) -> RoutingRequest:
    return RoutingRequest(request_id=rid, requested_model=model,
                          prompt_token_ids=list(tokens), num_prompt_tokens=len(tokens),
                          max_tokens=max_tokens, workflow=Workflow(**workflow))


# ---- tests of the interface ----


def registered(package: Any, base: type) -> dict[str, type]:
    """Every class derived from ``base`` with its own ``name``, defined in a module of
    ``package``, by name: what its registry must hold."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        found.update((obj.name, obj) for obj in vars(module).values()
                     if isinstance(obj, type) and issubclass(obj, base)
                     and obj.__module__ == module.__name__ and "name" in vars(obj))
    return found


def test_the_registry_has_every_policy_module() -> None:
    assert registered(router.policies, Policy) == POLICIES


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_accepts_its_defaults(name: str) -> None:
    validate_settings(name, {})


@pytest.mark.parametrize("name,table,needle", [
    ("nope", {}, "unknown policy 'nope'"),
    ("chimera", {"tua": 0.1}, "router.policies.chimera.tua: unknown key"),
    ("chimera", {"tau": "x"}, "router.policies.chimera.tau: expected a number, got a string"),
    ("chimera", {"tau": -0.1}, "router.policies.chimera.tau: must be >= 0"),
    ("chimera", {"sticky": 1}, "router.policies.chimera.sticky: expected true or false"),
    ("chimera", {"confidence": {"a": 1.5}}, "router.policies.chimera.confidence.a"),
    ("chimera", {"max_batch_size": {"a": 2.5}}, "router.policies.chimera.max_batch_size.a"),
    ("chimera", {"confidence": [0.5]}, "chimera.confidence: expected a table, got a list (of 1)"),
    ("random", {"seed": True}, "router.policies.random.seed: expected an integer, got a boolean"),
    ("laar", {"alpha": float("nan")}, "router.policies.laar.alpha: must be finite"),
    ("routebalance", {"w_quality": 0.5}, "must be 1 (the simplex)"),
    ("lmetric", {"win_factor": 0}, "router.policies.lmetric.win_factor: must be >= 1"),
])
def test_bad_settings_name_the_key(name: str, table: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        validate_settings(name, table)


def test_ints_are_accepted_for_floats() -> None:
    assert validate_settings("chimera", {"tau": 1}).tau == 1.0


@pytest.mark.parametrize("tokens,expected", [
    (None, None), (0.2, 1), (1.4, 1), (1.6, 2), (float("inf"), None),
    (2.0 ** 40, PRIORITY_MAX)])
def test_priority_follows_the_contract(tokens: float | None, expected: int | None) -> None:
    assert priority_for(tokens) == expected


def test_workflow_final_and_remaining_stages() -> None:
    assert Workflow(stage_index=2, num_stages=3).is_final
    assert not Workflow(stage_index=1, num_stages=3).is_final
    assert Workflow(final=True).is_final
    assert not Workflow(program_id="p").is_final
    assert Workflow(stage_index=1, num_stages=4).remaining_stages == 3
    assert Workflow().remaining_stages is None
    assert Workflow(tried_models=["a"]).tried_models == ("a",)


@pytest.mark.parametrize("name,needle", [
    ("chimera", "needs per-model confidences q\\[m\\]: train the semantic router"),
    ("routebalance", "cost_per_token: no price for a, b"),
    ("laar", "needs the capability model Q\\(m, x\\): train the capability model"),
])
def test_missing_predictor_fails_at_build_saying_what_to_train(name: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        World({"e0": "a", "e1": "b"}).build(name)


def test_static_prior_must_cover_every_model() -> None:
    with pytest.raises(ValueError, match="chimera.confidence: static_prior = true but no "
                                         "value for b"):
        World({"e0": "a", "e1": "b"}).build("chimera", {
            "static_prior": True, "confidence": {"a": 0.5}})


def test_predictor_that_does_not_know_a_model_is_rejected() -> None:
    class Router:
        models = frozenset({"a"})

        async def confidence(self, reqs: Any) -> Any:
            raise AssertionError

    with pytest.raises(ValueError, match="confidences q\\[m\\] for b, which the given "
                                         "predictor does not know"):
        World({"e0": "a", "e1": "b"}).build("chimera",
                                            predictors=PredictorSet(semantic_router=Router()))


def test_bad_sub_policy_table_fails_the_build() -> None:
    with pytest.raises(ValueError, match="router.policies.lmetric.hot_top_k"):
        World({"e0": "a"}).build("round_robin", others={"lmetric": {"hot_top_k": 0}})


def test_candidates_view_an_engine_when_read_and_once() -> None:
    """``Candidates`` (what the router gives policies): the models and one model's
    candidates without viewing any engine, iteration views each once, and policies' helpers
    answer the same for them as for a plain list."""
    w = World({"a0": "a", "b0": "b", "a1": "a", "b1": "b"})
    w.load("a1", batch=3)
    viewed: list[str] = []

    def view(e: Any) -> EngineView:
        viewed.append(e.name)
        return engine_view(e, w.ledger, w.now)

    cands = Candidates(list(w.table.engines.values()), view)
    assert models_of(cands) == models_of(w.cands()) == ["a", "b"] and viewed == []
    mine = of_model(cands, "a")
    assert viewed == []
    assert list(mine) == list(of_model(w.cands(), "a")) == w.cands("a")
    assert viewed == ["a0", "a1"]
    assert cands[0] == w.cands()[0] and viewed == ["a0", "a1", "a0"]  # views are per list
    assert list(cands) == list(cands) == w.cands()
    assert viewed == ["a0", "a1", "a0", "a1", "b0", "b1"]
    assert list(of_model(cands, "b")) == w.cands("b") and len(viewed) == 6  # kept
