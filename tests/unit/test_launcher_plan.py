"""launcher.plan: placement, ports, endpoints and commands, with no process started."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from launcher import LaunchError
from launcher.__main__ import main
from launcher.devices import Devices, format_ids
from launcher.plan import Plan
from launcher.planner import make_plan
from launcher.settings import load_launch_config
from router.config import cluster as cc

ROUTER = '[router]\npolicy = "chimera"\n'
DEMO = Path(__file__).parents[2] / "examples" / "demo.toml"
CPU2 = Devices(gpus=[], cpus=[0, 1])
GPU8 = Devices(gpus=list(range(8)), cpus=list(range(32)))


@pytest.fixture(autouse=True)
def no_policy_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "_policy_validator", lambda: None)


def all_free(host: str, port: int) -> bool:
    return True


def plan_of(tmp_path: Path, text: str, devices: Devices = CPU2, only: Sequence[str] = (),
            port_free: Callable[[str, int], bool] = all_free) -> Plan:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return make_plan(load_launch_config(path), devices, tmp_path / "run", only=only,
                     port_free=port_free, python="python")


def engine(name: str, body: str = "") -> str:
    return f'[[engines]]\nname = "{name}"\nmodel = "builtin:tiny-a"\n{body}'


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def by_name(plan: Plan) -> dict[str, list[str]]:
    return {p.spec.name: p.spec.argv for p in plan.engines}


def env_of(plan: Plan, name: str) -> dict[str, str]:
    return next(p.spec.env for p in plan.processes() if p.spec.name == name)


# ---------------------------------------------------------------- GPUs


def test_gpu_packing_mixed_tp_and_replicas(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("small", "replicas = 2\n")
                   + engine("big", "num_gpus = 4\n") + engine("mid", "tensor_parallel_size = 2\n"),
                   devices=GPU8)
    gpus = {p.spec.name: p.spec.env["CUDA_VISIBLE_DEVICES"] for p in plan.engines}
    assert gpus == {"big-0": "0,1,2,3", "mid-0": "4,5", "small-0": "6", "small-1": "7"}
    argv = by_name(plan)
    assert flag(argv["big-0"], "--tensor-parallel-size") == "4"
    assert flag(argv["mid-0"], "--tensor-parallel-size") == "2"
    assert "--tensor-parallel-size" not in argv["small-0"]
    assert flag(argv["small-1"], "--gpu-memory-utilization") == "0.9"
    assert "--kv-cache-memory-bytes" not in argv["small-1"]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env_of(plan, "big-0")
    assert {p.spec.name: p.devices for p in plan.engines}["big-0"] == "gpu 0-3"


def test_gpu_pinned_and_auto(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("pinned", "gpus = [0, 7]\nreplicas = 2\n")
                   + engine("tp4", "num_gpus = 4\nreplicas = 1\n")
                   + engine("tp2", "num_gpus = 2\n"), devices=GPU8)
    gpus = {p.spec.name: p.spec.env["CUDA_VISIBLE_DEVICES"] for p in plan.engines}
    assert gpus == {"pinned-0": "0", "pinned-1": "7", "tp4-0": "1,2,3,4", "tp2-0": "5,6"}


def test_gpu_sharing_by_memory_share(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, DEMO.read_text(), devices=Devices(gpus=[0], cpus=[0, 1]))
    assert [p.spec.env["CUDA_VISIBLE_DEVICES"] for p in plan.engines] == ["0", "0"]
    assert flag(plan.engines[0].spec.argv, "--gpu-memory-utilization") == "0.4"


def test_gpu_auto_spreads_before_sharing(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, DEMO.read_text(), devices=Devices(gpus=[2, 3], cpus=[0]))
    assert [p.spec.env["CUDA_VISIBLE_DEVICES"] for p in plan.engines] == ["2", "3"]


def test_not_enough_gpus(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"engines\.big: big-1 needs 4 GPU\(s\) with 0\.9 "
                                          r"of their memory free; 3 of the 8 visible"):
        plan_of(tmp_path, ROUTER + engine("big", "num_gpus = 4\nreplicas = 2\n")
                + engine("one", "gpus = [0]\n"), devices=GPU8)


def test_pinned_gpu_not_visible(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"cluster\.toml: engines\.a\.gpus: GPU 9 is not "
                                          r"visible \(visible: 0-7\)"):
        plan_of(tmp_path, ROUTER + engine("a", "gpus = [9]\n"), devices=GPU8)


# ---------------------------------------------------------------- CPUs


def test_demo_on_two_cores(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, DEMO.read_text())
    assert [p.spec.env["VLLM_CPU_OMP_THREADS_BIND"] for p in plan.engines] == ["0", "1"]
    assert [p.devices for p in plan.engines] == ["cpu 0", "cpu 1"]
    assert not plan.warnings
    for p in plan.engines:
        argv = p.spec.argv
        assert flag(argv, "--kv-cache-memory-bytes") == str(64 * 2**20)
        assert "--gpu-memory-utilization" not in argv
        assert "CUDA_VISIBLE_DEVICES" not in p.spec.env


def test_cpu_share_with_warning(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("a") + engine("b") + engine("c"))
    assert [p.spec.env["VLLM_CPU_OMP_THREADS_BIND"] for p in plan.engines] == ["0", "1", "0"]
    assert plan.warnings == ["3 engine instance(s) share 2 CPU core(s) (0-1): they will "
                             "slow each other down"]


def test_cpu_slices(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("pinned", "cpus = [0, 1]\n")
                   + engine("wide", "num_cpus = 3\n") + engine("even", "replicas = 2\n")
                   + engine("tp", "tensor_parallel_size = 2\nnum_cpus = 4\n"),
                   devices=Devices(gpus=[], cpus=list(range(16))))
    binds = {p.spec.name: p.spec.env["VLLM_CPU_OMP_THREADS_BIND"] for p in plan.engines}
    assert binds == {"pinned-0": "0-1", "wide-0": "2-4", "even-0": "5-8", "even-1": "9-11",
                     "tp-0": "12-13|14-15"}


def test_engine_niceness(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("a", "nice = 5\n") + engine("b"))
    assert {p.spec.name: p.spec.nice for p in plan.engines} == {"a-0": 5, "b-0": 0}
    assert plan.router is None or plan.router.spec.nice == 0
    with pytest.raises(Exception, match=r"engines\.a\.nice"):
        plan_of(tmp_path, ROUTER + engine("a", "nice = 20\n"))


def test_cpu_pinned_core_missing(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"engines\.a\.cpus: core\(s\) 4 not available"):
        plan_of(tmp_path, ROUTER + engine("a", "cpus = [4]\n"))


def test_kv_cache_bytes(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("a", "kv_cache_bytes = 1000000\n")
                   + '[[engines]]\nname = "b"\nmodel = "builtin:qwen2.5-0.5b-shape"\n')
    argv = by_name(plan)
    assert flag(argv["a-0"], "--kv-cache-memory-bytes") == "1000000"
    assert flag(argv["b-0"], "--kv-cache-memory-bytes") == str(2**30)


def test_format_ids() -> None:
    assert format_ids([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ids([3]) == "3"


# ---------------------------------------------------------------- ports, endpoints, commands


def test_ports_and_endpoints_assigned(tmp_path: Path) -> None:
    busy = {8100, 8102}
    plan = plan_of(tmp_path, ROUTER + engine("a", "replicas = 2\n") + engine("b", "port = 8101\n"),
                   port_free=lambda host, port: port not in busy)
    assert plan.router is not None and plan.router.port == 8103
    assert [(p.spec.name, p.port) for p in plan.engines] == [("a-0", 8104), ("a-1", 8105),
                                                             ("b-0", 8101)]
    run = tmp_path / "run"
    inst = {i.name: i for i in plan.config.instances()}
    assert inst["a-1"].telemetry_endpoint == f"ipc://{run}/a-1.telemetry"
    assert inst["a-1"].kv_events_endpoint == f"ipc://{run}/a-1.kv"
    assert inst["a-1"].url == "http://127.0.0.1:8105"
    assert plan.engines[1].spec.health_url == "http://127.0.0.1:8105/health"
    assert plan.router.spec.health_url == "http://127.0.0.1:8103/live"


def test_given_port_in_use(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"engines\.a\.port: port 9000 is already in use"):
        plan_of(tmp_path, ROUTER + engine("a", "port = 9000\n"),
                port_free=lambda host, port: port != 9000)


def test_resolved_file_is_what_the_router_loads(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, DEMO.read_text())
    plan.run_dir.mkdir()
    plan.config_path.write_text(plan.config.to_toml())
    loaded = load_launch_config(plan.config_path)
    assert loaded.instances() == plan.config.instances()
    assert loaded.router == plan.config.router and loaded.router.port == plan.router.port
    assert loaded.launcher.run_dir == str(plan.run_dir)
    assert plan.router is not None
    assert plan.router.spec.argv == ["python", "-m", "router", "--config",
                                     str(plan.config_path)]


def test_the_resolved_file_is_replaced_whole_while_it_is_read(tmp_path: Path) -> None:
    """A reader polling the file while it is rewritten never sees a part of it (the Ray
    scale test's client once read ``router: missing`` during a ``--scale``)."""
    plan = plan_of(tmp_path, DEMO.read_text())
    plan.run_dir.mkdir()
    plan.write_resolved()
    whole = plan.config_path.read_text()
    stop, seen = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            seen.append(plan.config_path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(300):
            plan.write_resolved()
    finally:
        stop.set()
        reader.join()
    assert seen and all(text == whole for text in seen)
    assert [p.name for p in plan.run_dir.iterdir()] == [plan.config_path.name]


def test_engine_command(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, DEMO.read_text().replace(
        'name = "tiny-a"', 'name = "tiny-a"\nsched_policy = "stjf"\nstarvation_threshold = 50\n'
        'quantum = 4\nextra_args = ["--swap-space", "1"]\nenv = { FOO = "bar" }', 1))
    argv = plan.engines[0].spec.argv
    assert argv[:3] == ["python", "-m", "engine_ext.serve"]
    expected = {"--model": "builtin:tiny-a", "--engine-id": "tiny-a-0", "--host": "127.0.0.1",
                "--served-model-name": "tiny-a", "--max-num-seqs": "8",
                "--max-model-len": "1024", "--dtype": "float32", "--sched-policy": "stjf",
                "--starvation-threshold": "50", "--quantum": "4",
                "--telemetry-interval-ms": "20"}
    assert {k: flag(argv, k) for k in expected} == expected
    assert "--enforce-eager" in argv
    assert argv[-2:] == ["--swap-space", "1"]
    env = plan.engines[0].spec.env
    assert env["FOO"] == "bar" and env["HF_HUB_OFFLINE"] == "1"
    assert plan.router is not None and plan.router.spec.env["HF_HUB_OFFLINE"] == "1"


def test_defaults_never_leave_loopback(tmp_path: Path) -> None:
    text = plan_of(tmp_path, DEMO.read_text()).render()
    assert "0.0.0.0" not in text and "tcp://" not in text
    assert "--host 127.0.0.1" in text


def test_render(tmp_path: Path) -> None:
    text = plan_of(tmp_path, DEMO.read_text()).render()
    assert "tiny-a-0  (engine, tiny-a)  port 8101  cpu 0" in text
    assert "VLLM_CPU_OMP_THREADS_BIND=1" in text
    assert "router  (router, chimera)  port 8100" in text
    assert "cmd  python -m engine_ext.serve --model builtin:tiny-b" in text


def test_only(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, DEMO.read_text(), only=["tiny-b"])
    assert plan.router is None
    assert [p.spec.name for p in plan.engines] == ["tiny-b-0"]
    assert [i.name for i in plan.config.instances()] == ["tiny-b-0"]
    with pytest.raises(LaunchError, match=r"--only tiny-c: no engine of that name"):
        plan_of(tmp_path, DEMO.read_text(), only=["tiny-c"])


REMOTE = ('[[engines]]\nname = "far-0"\nurl = "http://10.0.0.7:8101"\nserved_model_name = "far"'
          '\ntelemetry_endpoint = "tcp://127.0.0.1:5601"\n'
          'kv_events_endpoint = "tcp://127.0.0.1:5602"\n')


def test_remote_engine_not_started(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, ROUTER + engine("a") + REMOTE)
    assert [p.spec.name for p in plan.engines] == ["a-0"]
    assert [(i.name, i.url) for i in plan.remote] == [("far-0", "http://10.0.0.7:8101")]
    assert "far-0  (remote, far)  http://10.0.0.7:8101  not started here" in plan.render()
    with pytest.raises(LaunchError, match=r"engines\.far-0 is remote"):
        plan_of(tmp_path, ROUTER + engine("a") + REMOTE, only=["far-0"])


def test_ports_skip_given_endpoints(tmp_path: Path) -> None:
    text = ROUTER + engine("a", 'telemetry_endpoint = "tcp://127.0.0.1:8100"\n')
    plan = plan_of(tmp_path, text)
    assert plan.router is not None and plan.router.port == 8101


def test_ipc_path_too_long(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(DEMO.read_text())
    with pytest.raises(LaunchError, match="too deep for an ipc:// socket"):
        make_plan(load_launch_config(path), CPU2, tmp_path / ("x" * 120), port_free=all_free)


# ---------------------------------------------------------------- command line


def test_cli_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(DEMO), "--dry-run", "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"run dir  {tmp_path / 'run'}" in out
    assert "-m engine_ext.serve --model builtin:tiny-a" in out
    assert "-m router --config" in out
    assert not (tmp_path / "run").exists()


def test_cli_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(ROUTER + engine("a", "max_num_seq = 8\n"))
    assert main([str(path), "--dry-run"]) == 2
    assert capsys.readouterr().err == (f"error: {path}: engines.a.max_num_seq: unknown key "
                                       "(did you mean 'max_num_seqs'?)\n")


def test_router_workers(tmp_path: Path) -> None:
    """``workers = 2``: two router processes, each with --worker I and its own port for
    health checks, the program table's sockets in the run directory."""
    plan = plan_of(tmp_path, ROUTER + "port = 8090\nworkers = 2\n" + engine("a"))
    r = plan.config.router
    assert r.port == 8090 and r.worker_ports == [8100, 8101]
    assert r.sync_dir == str(tmp_path / "run")
    assert [p.spec.name for p in plan.routers] == ["router-0", "router-1"]
    assert [flag(p.spec.argv, "--worker") for p in plan.routers] == ["0", "1"]
    assert [p.spec.health_url for p in plan.routers] == [
        "http://127.0.0.1:8100/live", "http://127.0.0.1:8101/live"]
    assert plan.router is plan.routers[0]
    # the port's socket: bound by the launcher when it starts (launcher.listener)
    assert [flag(p.spec.argv, "--listen-fd") for p in plan.routers] == ["<listen-fd>"] * 2
    assert "--listen-fd '<listen-fd>'" in plan.render()
    one = plan_of(tmp_path, ROUTER + engine("a"))
    assert [p.spec.name for p in one.routers] == ["router"]
    assert flag(one.routers[0].spec.argv, "--worker") is None
    assert flag(one.routers[0].spec.argv, "--listen-fd") is None


def test_engine_api_key_from_the_environment(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``api_key_env``: the engine gets the key as VLLM_API_KEY (never on its command
    line), the plan never prints it, and an unset variable is a clear error."""
    text = ROUTER + engine("a", 'api_key_env = "HS_ENGINE_KEY"\n')
    with pytest.raises(LaunchError, match=r"engines\.a\.api_key_env: the environment "
                       "variable HS_ENGINE_KEY is not set"):
        plan_of(tmp_path, text)
    monkeypatch.setenv("HS_ENGINE_KEY", "s3cret-key")
    plan = plan_of(tmp_path, text)
    spec = plan.engines[0].spec
    assert spec.env["VLLM_API_KEY"] == "s3cret-key"
    assert "s3cret-key" not in " ".join(spec.argv)
    assert "s3cret-key" not in plan.render() and "VLLM_API_KEY=<secret>" in plan.render()
    assert plan.config.instances()[0].api_key_env == "HS_ENGINE_KEY"


def test_an_engine_whose_port_was_taken_moves(tmp_path: Path) -> None:
    """Before a restart: a taken port moves that replica (only) to the next free port
    from base_port, in its command, health URL and the resolved file the router loads."""
    from launcher.backends.local import move_engine

    plan = plan_of(tmp_path, ROUTER + engine("a", "replicas = 2\n"))
    assert [p.port for p in plan.engines] == [8101, 8102]
    assert move_engine(plan, "a-1", port_free=all_free) is None
    busy = {8102, 8103, 8104}
    moved = move_engine(plan, "a-1", port_free=lambda host, port: port not in busy)
    assert moved is not None
    assert [(p.spec.name, p.port, flag(p.spec.argv, "--port")) for p in moved.engines] == [
        ("a-0", 8101, "8101"), ("a-1", 8105, "8105")]
    assert moved.engines[1].spec.health_url == "http://127.0.0.1:8105/health"
    assert {i.name: i.url for i in moved.config.instances()} == {
        "a-0": "http://127.0.0.1:8101", "a-1": "http://127.0.0.1:8105"}
    assert moved.router is not None and moved.config.router.port == plan.config.router.port
    with pytest.raises(LaunchError, match="no port is free"):
        move_engine(plan, "a-0", port_free=lambda host, port: False)


# ---------------------------------------------------------------- stock vLLM engines


def test_a_stock_engine_runs_vllms_own_server(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, '[router]\npolicy = "round_robin"\n'
                   + engine("s", 'kind = "vllm"\nsched_policy = "priority"\nmax_num_seqs = 4\n')
                   + engine("p"))
    stock, patched = by_name(plan)["s-0"], by_name(plan)["p-0"]
    assert stock[:2] == ["vllm", "serve"] and stock[2].endswith(tuple("0123456789abcdef"))
    assert not any("engine_ext" in a for a in stock)
    assert not {"--scheduler-cls", "--additional-config", "--middleware"} & set(stock)
    assert flag(stock, "--scheduling-policy") == "priority"
    assert flag(stock, "--max-num-seqs") == "4" and "--enable-prefix-caching" in stock
    assert "--sched-policy" not in stock and "--telemetry-endpoint" not in stock
    kv = json.loads(flag(stock, "--kv-events-config") or "{}")
    assert kv["topic"] == "s-0" and kv["endpoint"] == f"ipc://{tmp_path}/run/s-0.kv"
    (inst,) = [i for i in plan.config.instances() if i.name == "s-0"]
    assert inst.kind == "vllm" and inst.telemetry_endpoint is None
    assert patched[1:3] == ["-m", "engine_ext.serve"]


def test_ray_does_not_start_stock_engines(tmp_path: Path) -> None:
    text = ('[router]\npolicy = "round_robin"\n[cluster]\nbackend = "ray"\n'
            + engine("s", 'kind = "vllm"\n'))
    with pytest.raises(cc.ConfigError, match="engines.s.kind: the Ray backend starts hetserve"):
        plan_of(tmp_path, text)


def test_the_mixed_demo_runs_one_stock_engine(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, (DEMO.parent / "mixed.toml").read_text())
    argv = by_name(plan)
    assert argv["tiny-a-0"][:2] == ["vllm", "serve"]
    assert flag(argv["tiny-a-0"], "--scheduling-policy") == "priority"
    assert flag(argv["tiny-b-0"], "-m") == "engine_ext.serve"
    assert [p.devices for p in plan.engines] == ["cpu 0", "cpu 1"]


def test_retention_keys_become_engine_flags(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, '[router]\npolicy = "round_robin"\n' + engine(
        "p", "retention_ttl_s = 5\nmax_protected_programs = 0\nretention_ttl_only = true\n"
        "admit_returning_first = true\n"))
    argv = by_name(plan)["p-0"]
    assert flag(argv, "--retention-ttl-s") == "5.0"
    assert flag(argv, "--max-protected-programs") == "0"
    assert "--retention-ttl-only" in argv and "--admit-returning-first" in argv


def test_program_admission_needs_the_stjf_scheduler(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"engines\.p\.admit_returning_first: .*stjf"):
        plan_of(tmp_path, '[router]\npolicy = "round_robin"\n' + engine(
            "p", 'sched_policy = "fcfs"\nadmit_returning_first = true\n'))
