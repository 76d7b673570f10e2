"""The launch plan: what runs, with which ports, endpoints, command and environment.

A ``Plan`` holds the resolved cluster file (every port and telemetry endpoint filled in,
re-validated exactly as the router will load it) and a ``ProcessPlan`` for each engine
replica and router process. Where engines run is a backend's part
(``launcher.backends``): this module holds what every backend shares, the command
line and environment of an engine (``engine_process``) and the router's processes.
``launcher.planner.make_plan`` puts a plan together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher import LaunchError
from launcher.ports import PortFree, take_port
from launcher.process import ProcessSpec
from launcher.settings import ENGINE_FLAGS, STOCK_ENGINE_FLAGS, LaunchConfig
from router.auth import KeysError, engine_key
from router.config.addresses import http_url
from router.config.cluster import RouterConfig
from router.config.engines import EngineConfig, EngineInstance, LocalEngine
from router.dispatch.peers import sync_endpoints

RESOLVED_NAME = "cluster.resolved.toml"
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
"""Environment of every process the launcher starts: nothing contacts a model hub."""
SECRET_ENV = frozenset({"VLLM_API_KEY"})
"""Environment variables the plan never prints."""
NODE_HOST = "<node-address>"
"""Stands in an engine's command line for its node's address (set where it lands)."""
NODE_PORT = "<node-port>"
"""Stands in an engine's command line for the port found free where it lands."""
LISTEN_FD = "<listen-fd>"
"""Stands in a router worker's command line for the descriptor of the port's socket,
which the launcher binds when it starts (``launcher.listener``)."""
TINY_KV_CACHE_BYTES = 64 * 2**20
"""Default CPU KV cache of a built-in tiny model (``builtin:tiny-*``)."""
CPU_KV_CACHE_BYTES = 2**30
"""Default CPU KV cache of any other model."""
_MAX_IPC_PATH = 107  # bytes in sockaddr_un.sun_path, less the NUL

@dataclass(frozen=True)
class ProcessPlan:
    """One process to start, with what the launcher shows about it."""

    spec: ProcessSpec
    kind: str
    """``engine`` or ``router``."""
    port: int
    """Its port (0: found where it lands, ``NODE_PORT``)."""
    devices: str
    """``gpu 0,1``, ``cpu 0-3``, ``ray 1 GPU``; empty for the router."""
    model: str
    """Served model name (the router: its policy)."""


@dataclass(frozen=True)
class Plan:
    config: LaunchConfig
    """The resolved cluster file (what the router loads)."""
    run_dir: Path
    engines: list[ProcessPlan]
    routers: list[ProcessPlan]
    """The router's processes: one, or ``router.workers``; none with ``--only``."""
    remote: list[EngineInstance]
    where: str
    """Where engines run, as ``--dry-run`` shows it (this machine's devices, a Ray
    cluster)."""
    warnings: list[str]
    telemetry_host: str | None = None
    """With engines placed elsewhere: where they reach the router's telemetry sockets."""
    python: str = sys.executable

    @property
    def config_path(self) -> Path:
        return self.run_dir / RESOLVED_NAME

    def write_resolved(self) -> None:
        """Write the resolved cluster file the router processes load, atomically (a
        temporary file renamed over it): a router (re)starting, or a user's tool reading
        it while ``--scale`` rewrites it, sees the old file or the new one, never a part."""
        tmp = self.config_path.with_name(f".{RESOLVED_NAME}.{os.getpid()}.tmp")
        tmp.write_text(f"# Resolved by the launcher from {self.config.source}; "
                       "the router loads this file.\n" + self.config.to_toml())
        os.replace(tmp, self.config_path)

    @property
    def router(self) -> ProcessPlan | None:
        """The (first) router process."""
        return self.routers[0] if self.routers else None

    def processes(self) -> list[ProcessPlan]:
        return self.engines + self.routers

    def render(self) -> str:
        """The plan as ``--dry-run`` prints it."""
        lines = [f"run dir  {self.run_dir}", f"devices  {self.where}", ""]
        for p in self.processes():
            where = f"  {p.devices}" if p.devices else ""
            lines.append(f"{p.spec.name}  ({p.kind}, {p.model})  port {p.port or NODE_PORT}"
                         f"{where}")
            lines.append("  env  " + " ".join(
                f"{k}={'<secret>' if k in SECRET_ENV else shlex.quote(v)}"
                for k, v in p.spec.env.items()))
            lines.append("  cmd  " + shlex.join(p.spec.argv))
            lines.append(f"  log  {p.spec.log_path}")
        for inst in self.remote:
            lines.append(f"{inst.name}  (remote, {inst.served_model_name})  {inst.url}  "
                         "not started here")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


class PortPlan:
    """The ports a plan hands out: the file's own, then free ones from
    ``launcher.base_port`` (errors name the user's file)."""

    def __init__(self, cfg: LaunchConfig, port_free: PortFree) -> None:
        self.cfg, self.port_free = cfg, port_free
        self.taken = cfg.claimed_ports()
        self._next = cfg.launcher.base_port

    def alloc(self, host: str) -> int:
        """The next free port on ``host``."""
        base = self.cfg.launcher.base_port
        port = take_port(host, self._next, self.taken, self.port_free, base)
        self._next = port + 1
        return port

    def check_free(self, key: str, host: str, port: int) -> None:
        """LaunchError if the file's ``key`` names a port in use."""
        if not self.port_free(host, port):
            raise LaunchError(f"{self.cfg.source}: {key}: port {port} is already in use on "
                              f"{host}")


def engine_process(cfg: LaunchConfig, e: EngineConfig, inst: EngineInstance, run_dir: Path,
                   python: str, *, gpu: bool, env: dict[str, str], health_url: str | None,
                   devices: str, placement: object = None) -> ProcessPlan:
    """The process of engine instance ``inst`` of ``e``: its command (``engine_argv``),
    environment (``BASE_ENV``, ``env``, its API key, the entry's own) and log."""
    return ProcessPlan(
        spec=ProcessSpec(
            name=inst.name, argv=engine_argv(python, cfg, e, inst, gpu=gpu),
            env={**BASE_ENV, **env, **_key_env(cfg, e), **e.env},
            log_path=run_dir / f"{inst.name}.log", health_url=health_url, nice=e.nice,
            yield_nice=0 if gpu else cfg.launcher.restart_yield_nice, placement=placement),
        kind="engine", port=inst.port, devices=devices, model=e.served_model_name)


def placed_entry(e: EngineConfig, name: str, telemetry_endpoint: str,
                 kv_events_endpoint: str, url: str, node: str) -> dict[str, object]:
    """The router's file entry of replica ``name`` of ``e``, running at ``url`` on
    ``node`` (also the body of ``POST /admin/engines/{name}/add``)."""
    entry = {"name": name, "url": url, "model": e.model,
             "served_model_name": e.served_model_name,
             "telemetry_endpoint": telemetry_endpoint,
             "kv_events_endpoint": kv_events_endpoint,
             "max_model_len": e.max_model_len, "max_num_seqs": e.max_num_seqs,
             "api_key_env": e.api_key_env, "node": node}
    return {k: v for k, v in entry.items() if v is not None}


def _key_env(cfg: LaunchConfig, e: EngineConfig) -> dict[str, str]:
    """The engine's API key (``VLLM_API_KEY``), if it has one."""
    if not e.api_key_env:
        return {}
    try:
        return {"VLLM_API_KEY": engine_key(e.name, e.api_key_env)}
    except KeysError as exc:
        raise LaunchError(f"{cfg.source}: {exc}") from None


ROUTER_LIVENESS = "/live"
"""The router's path a supervisor checks: 200 while it answers, even with every engine
down (its ``/health`` is readiness: 503 then, and restarting the router would not help)."""


def router_processes(cfg: LaunchConfig, run_dir: Path, python: str) -> list[ProcessPlan]:
    """The router process, or ``router.workers`` of them, each health-checked on its own
    port and serving the shared one on the socket the launcher binds (``--listen-fd``)."""
    r = cfg.router
    assert r.port is not None
    argv = [python, "-m", "router", "--config", str(run_dir / RESOLVED_NAME)]
    if r.workers == 1:
        return [ProcessPlan(
            spec=ProcessSpec(name="router", argv=argv, env=dict(BASE_ENV),
                             log_path=run_dir / "router.log",
                             health_url=cfg.router_url() + ROUTER_LIVENESS),
            kind="router", port=r.port, devices="", model=r.policy)]
    assert r.worker_ports is not None
    return [ProcessPlan(
        spec=ProcessSpec(name=f"router-{i}",
                         argv=[*argv, "--worker", str(i), "--listen-fd", LISTEN_FD],
                         env=dict(BASE_ENV), log_path=run_dir / f"router-{i}.log",
                         health_url=http_url(r.host, port) + ROUTER_LIVENESS),
        kind="router", port=port, devices="", model=r.policy)
        for i, port in enumerate(r.worker_ports)]


def engine_argv(python: str, cfg: LaunchConfig, e: EngineConfig, inst: EngineInstance,
                gpu: bool) -> list[str]:
    """The command of one instance of ``e``: ``python -m engine_ext.serve ...``, or for a
    stock engine (``kind = "vllm"``) vLLM's own server (``stock_engine_argv``)."""
    assert isinstance(e, LocalEngine)
    if e.kind == "vllm":
        return stock_engine_argv(python, e, inst, gpu)
    assert inst.telemetry_endpoint is not None and inst.kv_events_endpoint is not None
    argv = [python, "-m", "engine_ext.serve", "--model", e.model or "",
            "--engine-id", inst.name, "--host", e.host, "--port", str(inst.port),
            "--served-model-name", e.served_model_name,
            "--telemetry-endpoint", inst.telemetry_endpoint,
            "--telemetry-interval-ms", f"{cfg.router.telemetry_interval_ms:g}",
            "--kv-events-endpoint", inst.kv_events_endpoint]
    if cfg.router.telemetry_keys_dir:
        argv += ["--telemetry-keys-dir", cfg.router.telemetry_keys_dir]
    return argv + _engine_flags(e, ENGINE_FLAGS, gpu)


def stock_engine_argv(python: str, e: LocalEngine, inst: EngineInstance,
                      gpu: bool) -> list[str]:
    """``vllm serve MODEL ...``, the ``vllm`` command beside ``python`` (the project's
    environment): unmodified vLLM with prefix caching, the entry's scheduler
    (``--scheduling-policy``) and, when it has an endpoint, vLLM's own KV events to the
    router's socket (topic: the instance name); a built-in model as its folder."""
    from engine_ext.builtin_models import load_format, resolve_model

    assert e.model is not None
    argv = [str(Path(python).parent / "vllm"), "serve", resolve_model(e.model),
            "--host", e.host, "--port", str(inst.port),
            "--served-model-name", e.served_model_name, "--enable-prefix-caching",
            "--scheduling-policy", e.sched_policy or "fcfs"]
    if inst.kv_events_endpoint is not None:
        argv += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": inst.kv_events_endpoint, "topic": inst.name})]
    if e.load_format is None and (fmt := load_format(e.model)):
        argv += ["--load-format", fmt]
    return argv + _engine_flags(e, STOCK_ENGINE_FLAGS, gpu)


def default_kv_cache_bytes(model: str | None) -> int:
    """CPU KV cache size for an engine that does not set ``kv_cache_bytes``."""
    if model is not None and model.startswith("builtin:tiny-"):
        return TINY_KV_CACHE_BYTES
    return CPU_KV_CACHE_BYTES


def _engine_flags(e: LocalEngine, flags: dict[str, str], gpu: bool) -> list[str]:
    """The entry's keys as the server's flags, its parallelism, GPU memory share and KV
    cache size, then its ``extra_args``."""
    argv: list[str] = []
    for key, flag in flags.items():
        value = getattr(e, key)
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    if e.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(e.tensor_parallel_size)]
    if gpu:
        argv += ["--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}"]
    kv_bytes = e.kv_cache_bytes if gpu else e.kv_cache_bytes or default_kv_cache_bytes(e.model)
    if kv_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(kv_bytes)]
    return argv + e.extra_args


# ---------------------------------------------------------------- resolution


def resolve_router(cfg: LaunchConfig, run_dir: Path, ports: PortPlan) -> RouterConfig:
    """The router's table with its ports (and its workers' sync directory) set."""
    router = cfg.router
    if router.port is None:
        router = dataclasses.replace(router, port=ports.alloc(router.host))
    else:
        ports.check_free("router.port", router.host, router.port)
    if router.workers > 1:
        worker_ports = router.worker_ports or [ports.alloc(router.host)
                                               for _ in range(router.workers)]
        if router.worker_ports:
            for i, p in enumerate(worker_ports):
                ports.check_free(f"router.worker_ports[{i}]", router.host, p)
        router = dataclasses.replace(router, worker_ports=worker_ports,
                                     sync_dir=router.sync_dir or str(run_dir))
        assert router.sync_dir is not None and router.port is not None
        for ep in sync_endpoints(router.sync_dir, router.port, router.workers):
            _check_ipc_length(ep.removeprefix("ipc://"), "router.sync_dir")
    return router


def select(cfg: LaunchConfig, only: Sequence[str]) -> LaunchConfig:
    """``cfg`` with only the engine entries ``only`` names (all if none)."""
    if not only:
        return cfg
    names = [e.name for e in cfg.engines]
    for name in only:
        if name not in names:
            raise LaunchError(f"--only {name}: no engine of that name in {cfg.source} "
                              f"(engines: {', '.join(names)})")
        if cfg.engine(name).remote:
            raise LaunchError(f"--only {name}: engines.{name} is remote (it has a url); "
                              "start it on its own host")
    return dataclasses.replace(cfg, engines=[e for e in cfg.engines if e.name in only])


def ipc_endpoint(run_dir: Path, instance: str, stream: str) -> str:
    path = run_dir / f"{instance}.{stream}"
    _check_ipc_length(str(path), "run directory")
    return f"ipc://{path}"


def _check_ipc_length(path: str, what: str) -> None:
    if len(path.encode()) > _MAX_IPC_PATH:
        raise LaunchError(f"{what} {Path(path).parent} is too deep for an ipc:// socket "
                          f"({path} is over {_MAX_IPC_PATH} bytes): pass a shorter --run-dir")


def one(values: list[int] | list[str]) -> int | str | list[int] | list[str]:
    """A single replica's value as a scalar (tidier resolved files), else the list."""
    return values[0] if len(values) == 1 else values


