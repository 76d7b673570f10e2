"""Engine pickers (``router.policies.pickers``): the registry, the ``picker`` setting of the
policies that choose the model first, and ``least_kv``, the picker added as one module and
one registration line (docs/policies.md, "Add an engine picker")."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any, Sequence

import pytest

import router.policies.pickers
import router.policies.pickers.registry
from router.config.cluster import ConfigError, load_cluster_config
from router.policies import POLICIES, validate_settings
from router.policies.base import PickerPolicy
from router.policies.parts import load
from router.policies.pickers import PICKERS, Pick, Picker
from router.policies.pickers.least_kv import LeastKv
from router.policies.registry import build_policy
from router.predictors.base import PredictorSet
from router.state.view import EngineView, StateView
from router.types import ClusterInfo, RoutingRequest
from router.vinelm.objective import Objective
from tests.unit.test_policies_base import World, registered, req

PICKER_POLICIES = sorted(n for n, p in POLICIES.items() if issubclass(p, PickerPolicy))
SETTING_POLICIES = sorted(n for n in PICKER_POLICIES if "picker" in {
    f.name for f in dataclasses.fields(POLICIES[n].Settings)})
"""The policies that choose the model, then an engine of it with their ``picker``."""
TABLES: dict[str, dict[str, Any]] = {
    "chimera": {"static_prior": True, "confidence": {"a": 0.5, "b": 0.9},
                "mean_output_tokens": {"a": 100, "b": 100},
                "decode_ms_per_token": {"a": 1.0, "b": 1.0},
                "max_batch_size": {"a": 8, "b": 8}},
    "laar": {"static_prior": True, "capability": {"a": 0.5, "b": 0.9},
             "decode_ms_per_token": {"a": 1.0, "b": 1.0},
             "mean_output_tokens": {"a": 100, "b": 100}},
    "vinelm": {"static_prior": True, "load_aware": False, "fallback": "lmetric",
               "workflows": {"w": {"stages": [{"name": "s", "models": ["b"],
                                               "answers": True}]}},
               "success": {"b": 0.9}, "cost_per_call": {"b": 1.0},
               "latency_s_per_call": {"b": 1.0}},
    "random_mix": {"big_model": "b", "share": 1.0},
    "cascade": {"models": ["b", "a"]},
    "online": {"decode_ms_per_token": {"a": 5.0, "b": 1.0}},  # b the fast model
}
"""Settings under which each model-choosing policy sends the request below to model b."""
REQUEST: dict[str, Any] = {"program_id": "p", "objective": Objective("max_accuracy"),
                           "workflow": "w", "stage": "s", "stage_index": 0}


def test_every_picker_module_is_registered() -> None:
    assert registered(router.policies.pickers, Picker) == PICKERS


def test_a_picker_is_registered_by_one_line() -> None:
    """docs/policies.md, "Add an engine picker": its ``"name": "module:Class"`` line in
    ``PICKERS``, no import of its module beside it."""
    source = inspect.getsource(router.policies.pickers.registry)
    for name, cls in PICKERS.items():
        module = cls.__module__.rsplit(".", 1)[1]
        assert source.count(f'"{name}": "{module}:{cls.__name__}",\n') == 1
        assert f"{module} import" not in source


def test_a_registry_line_naming_another_part_fails_at_load() -> None:
    assert load("router.policies.pickers", Picker, {"least_kv": "least_kv:LeastKv"}) == {
        "least_kv": LeastKv}
    with pytest.raises(TypeError) as e:
        load("router.policies.pickers", Picker, {"kv": "least_kv:LeastKv"})
    assert str(e.value) == ("router.policies.pickers.least_kv:LeastKv is not a Picker "
                            "named 'kv'")
    with pytest.raises(TypeError, match="^router.policies.chimera:Chimera is not a Picker"):
        load("router.policies", Picker, {"chimera": "chimera:Chimera"})


def test_the_model_choosing_policies_take_a_picker() -> None:
    assert set(SETTING_POLICIES) >= {"chimera", "laar", "vinelm", "random_mix", "cascade"}


@pytest.mark.parametrize("name", SETTING_POLICIES)
def test_the_picker_setting_defaults_to_the_policys_picker(name: str) -> None:
    policy = POLICIES[name]
    assert validate_settings(name, {}).picker == policy.default_picker
    for picker in PICKERS:
        assert validate_settings(name, {"picker": picker}).picker == picker


@pytest.mark.parametrize("name", SETTING_POLICIES)
def test_an_unknown_picker_names_the_key_and_the_pickers(name: str) -> None:
    with pytest.raises(ValueError) as e:
        validate_settings(name, {"picker": "least_kvv"})
    assert str(e.value) == (
        f"router.policies.{name}.picker: unknown picker 'least_kvv' (did you mean "
        f"'least_kv'?); known pickers: {', '.join(PICKERS)}")


def world() -> World:
    """b0 has the most KV in use but no request; b1 the least KV and six requests."""
    w = World({"a0": "a", "b0": "b", "b1": "b"})
    w.load("a0", kv=0.0)
    w.load("b0", kv=0.7)
    w.load("b1", batch=4, waiting=2, kv=0.1)
    return w


@pytest.mark.parametrize("name", SETTING_POLICIES)
@pytest.mark.parametrize("picker,engine", [("least_kv", "b1"), ("least_loaded", "b0"),
                                           ("lmetric", "b0")])
def test_the_picker_chooses_among_the_chosen_models_engines(name: str, picker: str,
                                                            engine: str) -> None:
    w = world()
    p = w.build(name, {**TABLES[name], "picker": picker})
    d = w.decide(p, req(tokens=list(range(100, 112)), **REQUEST))
    assert (d.model, d.instance, d.policy) == ("b", engine, name)


def test_least_kv_ties_go_to_fewer_inflight_requests_then_the_name() -> None:
    w = World({"e0": "a", "e1": "a", "e2": "a"})
    w.load("e0", kv=0.3)
    w.load("e1", kv=0.2, batch=9)
    w.load("e2", kv=0.2)
    picker = PICKERS["least_kv"]()
    assert picker.pick(req(), w.cands(), w.view()).engine.name == "e1"   # the name
    w.inflight("e1", "a", 10.0, "r1")
    assert picker.pick(req(), w.cands(), w.view()).engine.name == "e2"   # fewer in flight
    w.load("e0", kv=0.1)
    w.inflight("e0", "a", 10.0, "r2")
    w.inflight("e0", "a", 10.0, "r3")
    assert picker.pick(req(), w.cands(), w.view()) == Pick(w.cands()[0], {})  # least KV


CLUSTER = '''[router]
policy = "{policy}"

[router.policies.{policy}]
picker = "{picker}"
{settings}
[[engines]]
name = "a0"
model = "builtin:tiny-a"
served_model_name = "tiny-a"

[[engines]]
name = "b0"
model = "builtin:tiny-b"
served_model_name = "tiny-b"

[[engines]]
name = "b1"
model = "builtin:tiny-b"
served_model_name = "tiny-b"
'''


def cluster_file(tmp_path: Path, policy: str, picker: str, settings: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(CLUSTER.format(policy=policy, picker=picker, settings=settings))
    return path


@pytest.mark.parametrize("policy,settings", [
    ("random_mix", 'big_model = "tiny-b"\nshare = 1.0\n'),
    ("chimera", 'static_prior = true\nconfidence = {"tiny-a" = 0.5, "tiny-b" = 0.9}\n'
                'mean_output_tokens = {"tiny-a" = 100, "tiny-b" = 100}\n'
                'decode_ms_per_token = {"tiny-a" = 1.0, "tiny-b" = 1.0}\n'
                'max_batch_size = {"tiny-a" = 8, "tiny-b" = 8}\n'),
])
def test_a_cluster_file_routes_by_the_picker_it_names(tmp_path: Path, policy: str,
                                                      settings: str) -> None:
    cfg = load_cluster_config(cluster_file(tmp_path, policy, "least_kv", settings))
    engines = {e.name: e.served_model_name for e in cfg.engines}
    p = build_policy(cfg.router.policy, cfg.router.policies, ClusterInfo(engines),
                     PredictorSet())
    w = World(engines)
    w.load("a0", kv=0.0)
    w.load("b0", kv=0.7)
    w.load("b1", batch=4, waiting=2, kv=0.1)
    d = w.decide(p, req(tokens=list(range(100, 112)), program_id="p", stage_index=0))
    assert (d.model, d.instance) == ("tiny-b", "b1")


def test_a_cluster_file_naming_an_unknown_picker_fails_at_load(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, "random_mix", "kv", 'big_model = "tiny-b"\n')
    with pytest.raises(ConfigError) as e:
        load_cluster_config(path)
    assert str(e.value) == (f"{path}: router.policies.random_mix.picker: unknown picker "
                            f"'kv'; known pickers: {', '.join(PICKERS)}")


def test_each_policy_builds_its_own_picker() -> None:
    """LMETRIC's hotspot counters are per policy, as before pickers were parts."""
    w = world()
    p = w.build("vinelm", {**TABLES["vinelm"], "fallback": "chimera"},
                others={"chimera": TABLES["chimera"]})
    assert isinstance(p, PickerPolicy) and isinstance(p.fallback, PickerPolicy)
    assert p.picker is not p.fallback.picker
    assert type(p.picker) is type(p.fallback.picker) is PICKERS["lmetric"]


class ReadsTheFuture(Picker):
    name = "future"
    inputs = frozenset({"kv_usage", "next_minute_load"})

    def pick(self, req: RoutingRequest, cands: Sequence[EngineView],
             view: StateView) -> Pick:
        return Pick(cands[0], {})


def test_a_picker_reading_what_the_router_lacks_fails_at_load(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(PICKERS, "future", ReadsTheFuture)
    problem = ("engine picker 'future' reads next_minute_load, which the router does not "
               "have; inputs: ")
    with pytest.raises(ValueError, match=f"^router.policies.random_mix.picker: {problem}"):
        world().build("random_mix", {**TABLES["random_mix"], "picker": "future"})
    path = cluster_file(tmp_path, "random_mix", "future", 'big_model = "tiny-b"\n')
    with pytest.raises(ConfigError, match=f"router.policies.random_mix.picker: {problem}"):
        load_cluster_config(path)
    monkeypatch.setattr(POLICIES["vllm"], "default_picker", "future")
    with pytest.raises(ValueError, match=f"^{problem}"):
        world().build("vllm")
