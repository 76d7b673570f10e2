"""The Ray backend's plan (``[cluster] backend = "ray"``), with no Ray cluster: what each
replica asks of Ray, its command and endpoints, the file the router loads once placed,
and what the cluster file refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import LaunchError
from launcher.backends import ray as ray_backend
from launcher.backends.ray import RayPlacement
from launcher.plan import NODE_HOST, NODE_PORT, Plan
from launcher.planner import make_plan
from launcher.settings import LaunchConfig, load_launch_config
from router.config import cluster as cc
from router.config.cluster import ConfigError, load_cluster_config

ROUTER = '[router]\npolicy = "round_robin"\n'
RAY = '[cluster]\nbackend = "ray"\naddress = "127.0.0.1:6379"\n'


@pytest.fixture(autouse=True)
def no_policy_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "_policy_validator", lambda: None)


def load(tmp_path: Path, text: str) -> LaunchConfig:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return load_launch_config(path)


def plan_of(tmp_path: Path, text: str) -> Plan:
    return make_plan(load(tmp_path, text), None, tmp_path / "run",  # type: ignore[arg-type]
                     port_free=lambda host, port: True, python="python",
                     ray_host="127.0.0.1")


def engine(name: str, body: str = "") -> str:
    return f'[[engines]]\nname = "{name}"\nmodel = "builtin:tiny-a"\n{body}'


def test_each_replica_asks_ray_for_its_resources(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + RAY
                   + engine("big", 'num_gpus = 2\nresources = { "gpu-h100" = 1 }\n')
                   + engine("small", "replicas = 2\nnum_cpus = 3\n"))
    placements: dict[str, RayPlacement] = {p.spec.name: p.spec.placement
                                           for p in plan.engines}
    assert list(placements) == ["big-0", "small-0", "small-1"]
    big = placements["big-0"]
    assert big.bundles == [{"GPU": 1, "CPU": 1, "gpu-h100": 1}, {"GPU": 1}] and big.gpus == 2
    assert placements["small-0"].bundles == [{"CPU": 3}] and placements["small-0"].gpus == 0
    argv = plan.engines[0].spec.argv
    assert argv[argv.index("--host") + 1] == NODE_HOST
    assert argv[argv.index("--port") + 1] == NODE_PORT
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--gpu-memory-utilization" in argv
    assert "CUDA_VISIBLE_DEVICES" not in plan.engines[0].spec.env  # Ray's leases set it
    endpoints = [e for p in placements.values()
                 for e in (p.telemetry_endpoint, p.kv_events_endpoint)]
    assert len(set(endpoints)) == 6 and all(e.startswith("tcp://127.0.0.1:") for e in endpoints)
    ports = {int(e.rsplit(":", 1)[1]) for e in endpoints}
    assert plan.config.router.port is not None
    for p in placements.values():  # an engine on the router's host never takes these
        assert ports | {plan.config.router.port} <= p.avoid_ports
    assert "Ray cluster 127.0.0.1:6379" in plan.render()


def test_placed_engines_become_the_router_s_entries(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + RAY + engine("a", "replicas = 2\nmax_model_len = 512\n")
                   + '[[engines]]\nname = "far"\nurl = "http://127.0.0.1:9999"\n'
                   'telemetry_endpoint = "tcp://127.0.0.1:9998"\n'
                   'kv_events_endpoint = "tcp://127.0.0.1:9997"\n')
    placed = ray_backend.placed(plan, {"a-0": ("http://127.0.0.1:8201", "127.0.0.1 (aaaa)"),
                                "a-1": ("http://127.0.0.1:8202", "127.0.0.1 (bbbb)")})
    instances = {i.name: i for i in placed.config.instances()}
    assert set(instances) == {"a-0", "a-1", "far"}
    a1 = instances["a-1"]
    assert (a1.url, a1.node, a1.served_model_name, a1.max_model_len) == (
        "http://127.0.0.1:8202", "127.0.0.1 (bbbb)", "a", 512)
    assert a1.telemetry_endpoint == plan.engines[1].spec.placement.telemetry_endpoint
    placed.run_dir.mkdir()
    placed.write_resolved()  # what the router loads
    again = load_cluster_config(placed.config_path)
    assert {i.name: i.url for i in again.instances()} == {
        n: i.url for n, i in instances.items()}


def test_a_replica_added_avoids_the_ports_placed_replicas_hold(tmp_path: Path) -> None:
    """Scaling up while a replica is dead (its port free, its restart pending): the new
    replica's endpoints skip the ports placed replicas hold (taking one made the router's
    file invalid and stopped the cluster)."""
    plan = plan_of(tmp_path, ROUTER + RAY + engine("a") + engine("b"))

    def added(held: set[int]) -> set[int]:
        bigger = ray_backend.with_replicas(plan, "b", 2, lambda host, port: True, held=held)
        (new,) = [p.spec.placement for p in bigger.engines if p.spec.name == "b-1"]
        return {int(e.rsplit(":", 1)[1])
                for e in (new.telemetry_endpoint, new.kv_events_endpoint)}

    first = added(set())
    assert not added(first) & first


@pytest.mark.parametrize("body, key", [
    ('host = "10.0.0.1"\n', "engines.a.host"),
    ("port = 8000\n", "engines.a.port"),
    ("gpus = [0]\n", "engines.a.gpus"),
    ("cpus = [0]\n", "engines.a.cpus"),
    ('telemetry_endpoint = "ipc:///tmp/x"\n', "engines.a.telemetry_endpoint"),
])
def test_ray_places_what_a_local_cluster_file_pins(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, ROUTER + RAY + engine("a", body))
    assert info.value.key == key and "set by the Ray backend" in info.value.problem


def test_resources_need_the_ray_backend(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, ROUTER + engine("a", 'resources = { "gpu-h100" = 1 }\n'))
    assert info.value.key == "engines.a.resources"


def test_only_is_refused_with_ray(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--only"):
        make_plan(load(tmp_path, ROUTER + RAY + engine("a")), None,  # type: ignore[arg-type]
                  tmp_path / "run", only=["a"], ray_host="127.0.0.1")
