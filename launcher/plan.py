"""The launch plan: ports, endpoints, device placement and the command of every process.

``make_plan`` is pure apart from probing which ports are free (injectable): it resolves
the cluster file (every port and telemetry endpoint filled in, re-validated exactly as
the router will load it), places engines on GPUs (``CUDA_VISIBLE_DEVICES``, tensor
parallel groups packed onto the least-loaded GPUs) or, with no GPU visible, on disjoint
CPU core sets (``VLLM_CPU_OMP_THREADS_BIND``, ``--kv-cache-memory-bytes``), and builds
the command line and environment of each engine and of the router.
"""

from __future__ import annotations

import dataclasses
import shlex
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher import LaunchError
from launcher.devices import Devices, format_ids
from launcher.supervisor import ProcessSpec
from router.auth import KeysError, engine_key
from router.config import (
    ENGINE_FLAGS,
    ClusterConfig,
    EngineConfig,
    EngineInstance,
    default_kv_cache_bytes,
    http_url,
    parse_cluster_config,
)
from router.dispatch.peers import sync_endpoints

RESOLVED_NAME = "cluster.resolved.toml"
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
"""Environment of every process the launcher starts: nothing contacts a model hub."""
SECRET_ENV = frozenset({"VLLM_API_KEY"})
"""Environment variables the plan never prints."""
_MAX_IPC_PATH = 107  # bytes in sockaddr_un.sun_path, less the NUL

PortFree = Callable[[str, int], bool]


@dataclass(frozen=True)
class ProcessPlan:
    """One process to start, with what the launcher shows about it."""

    spec: ProcessSpec
    kind: str
    """``engine`` or ``router``."""
    port: int
    devices: str
    """``gpu 0,1``, ``cpu 0-3``; empty for the router."""
    model: str
    """Served model name (the router: its policy)."""


@dataclass(frozen=True)
class Plan:
    config: ClusterConfig
    """The resolved cluster file (what the router loads)."""
    run_dir: Path
    engines: list[ProcessPlan]
    routers: list[ProcessPlan]
    """The router's processes: one, or ``router.workers``; none with ``--only``."""
    remote: list[EngineInstance]
    devices: Devices
    warnings: list[str]

    @property
    def config_path(self) -> Path:
        return self.run_dir / RESOLVED_NAME

    def write_resolved(self) -> None:
        """Write the resolved cluster file the router processes load."""
        self.config_path.write_text(f"# Resolved by the launcher from {self.config.source}; "
                                    "the router loads this file.\n" + self.config.to_toml())

    @property
    def router(self) -> ProcessPlan | None:
        """The (first) router process."""
        return self.routers[0] if self.routers else None

    def processes(self) -> list[ProcessPlan]:
        return self.engines + self.routers

    def render(self) -> str:
        """The plan as ``--dry-run`` prints it."""
        lines = [f"run dir  {self.run_dir}", f"devices  {self.devices.describe()}", ""]
        for p in self.processes():
            where = f"  {p.devices}" if p.devices else ""
            lines.append(f"{p.spec.name}  ({p.kind}, {p.model})  port {p.port}{where}")
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


def make_plan(cfg: ClusterConfig, devices: Devices, run_dir: Path,
              only: Sequence[str] = (), port_free: PortFree | None = None,
              python: str = sys.executable) -> Plan:
    """Plan the cluster of ``cfg`` in ``run_dir`` (absolute); with ``only``, just those
    engines and no router (for a host that runs part of a cluster)."""
    port_free = port_free or port_is_free
    cfg = _select(cfg, only)
    resolved = _resolve(cfg, run_dir, start_router=not only, port_free=port_free)
    local = [i for i in resolved.instances() if not i.remote]
    warnings: list[str] = []
    if devices.gpus:
        placed = place_gpus(resolved, devices.gpus)
    else:
        placed = place_cpus(resolved, devices.cpus, warnings)
    engines = []
    for inst in local:
        e = resolved.engine(inst.engine)
        ids = placed[inst.name]
        if devices.gpus:
            env, where = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}, "gpu"
        else:
            env = {"VLLM_CPU_OMP_THREADS_BIND": _omp_bind(ids, e.tensor_parallel_size)}
            where = "cpu"
        if e.api_key_env:
            try:
                env["VLLM_API_KEY"] = engine_key(e.name, e.api_key_env)
            except KeysError as exc:
                raise LaunchError(f"{cfg.source}: {exc}") from None
        engines.append(ProcessPlan(
            spec=ProcessSpec(
                name=inst.name,
                argv=engine_argv(python, resolved, e, inst, gpu=bool(devices.gpus)),
                env={**BASE_ENV, **env, **e.env},
                log_path=run_dir / f"{inst.name}.log",
                health_url=inst.url + "/health", nice=e.nice),
            kind="engine", port=inst.port, devices=f"{where} {format_ids(ids)}",
            model=inst.served_model_name))
    routers = [] if only else _routers(resolved, run_dir, python)
    remote = [i for i in resolved.instances() if i.remote]
    return Plan(resolved, run_dir, engines, routers, remote, devices, warnings)


def _routers(cfg: ClusterConfig, run_dir: Path, python: str) -> list[ProcessPlan]:
    """The router process, or ``router.workers`` of them, each health-checked on its own
    port (the shared one answers from any of them)."""
    r = cfg.router
    assert r.port is not None
    argv = [python, "-m", "router", "--config", str(run_dir / RESOLVED_NAME)]
    if r.workers == 1:
        return [ProcessPlan(
            spec=ProcessSpec(name="router", argv=argv, env=dict(BASE_ENV),
                             log_path=run_dir / "router.log",
                             health_url=cfg.router_url() + "/health"),
            kind="router", port=r.port, devices="", model=r.policy)]
    assert r.worker_ports is not None
    return [ProcessPlan(
        spec=ProcessSpec(name=f"router-{i}", argv=[*argv, "--worker", str(i)],
                         env=dict(BASE_ENV), log_path=run_dir / f"router-{i}.log",
                         health_url=http_url(r.host, port) + "/health"),
        kind="router", port=port, devices="", model=r.policy)
        for i, port in enumerate(r.worker_ports)]


def engine_argv(python: str, cfg: ClusterConfig, e: EngineConfig, inst: EngineInstance,
                gpu: bool) -> list[str]:
    """``python -m engine_ext.serve ...`` for one instance of ``e``."""
    argv = [python, "-m", "engine_ext.serve", "--model", e.model or "",
            "--engine-id", inst.name, "--host", e.host, "--port", str(inst.port),
            "--served-model-name", e.served_model_name,
            "--telemetry-endpoint", inst.telemetry_endpoint,
            "--telemetry-interval-ms", f"{cfg.router.telemetry_interval_ms:g}",
            "--kv-events-endpoint", inst.kv_events_endpoint]
    if cfg.router.telemetry_keys_dir:
        argv += ["--telemetry-keys-dir", cfg.router.telemetry_keys_dir]
    for key, flag in ENGINE_FLAGS.items():
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


def _select(cfg: ClusterConfig, only: Sequence[str]) -> ClusterConfig:
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


def _resolve(cfg: ClusterConfig, run_dir: Path, start_router: bool,
             port_free: PortFree) -> ClusterConfig:
    """``cfg`` with every port and endpoint of what it starts set, as the router loads it
    (still naming the user's file in errors)."""
    taken = cfg.claimed_ports()
    next_port = [cfg.launcher.base_port]

    def alloc(host: str) -> int:
        port = _free_port(host, next_port[0], taken, port_free)
        if port is None:
            raise LaunchError(f"no free port from launcher.base_port "
                              f"{cfg.launcher.base_port} upwards")
        taken.add(port)
        next_port[0] = port + 1
        return port

    def check_free(key: str, host: str, port: int) -> None:
        if not port_free(host, port):
            raise LaunchError(f"{cfg.source}: {key}: port {port} is already in use on "
                              f"{host}")

    router = cfg.router
    if start_router:
        if router.port is None:
            router = dataclasses.replace(router, port=alloc(router.host))
        else:
            check_free("router.port", router.host, router.port)
        if router.workers > 1:
            ports = router.worker_ports or [alloc(router.host) for _ in range(router.workers)]
            if router.worker_ports:
                for i, p in enumerate(ports):
                    check_free(f"router.worker_ports[{i}]", router.host, p)
            router = dataclasses.replace(router, worker_ports=ports,
                                         sync_dir=router.sync_dir or str(run_dir))
            assert router.sync_dir is not None and router.port is not None
            for ep in sync_endpoints(router.sync_dir, router.port, router.workers):
                _check_ipc_length(ep.removeprefix("ipc://"), "router.sync_dir")
    engines = []
    for e in cfg.engines:
        if e.remote:
            engines.append(e)
            continue
        names = [f"{e.name}-{i}" for i in range(e.replicas)]
        if e.port is None:
            port: int | list[int] = _one([alloc(e.host) for _ in names])
        else:
            port = e.port
            for p in port if isinstance(port, list) else [port + i for i in range(e.replicas)]:
                check_free(f"engines.{e.name}.port", e.host, p)
        tele = e.telemetry_endpoint or _one([_ipc(run_dir, n, "telemetry") for n in names])
        kv = e.kv_events_endpoint or _one([_ipc(run_dir, n, "kv") for n in names])
        engines.append(dataclasses.replace(e, port=port, telemetry_endpoint=tele,
                                           kv_events_endpoint=kv))
    launcher = dataclasses.replace(cfg.launcher, run_dir=str(run_dir))
    draft = dataclasses.replace(cfg, router=router, engines=engines, launcher=launcher)
    return parse_cluster_config(draft.to_dict(), cfg.source, run_dir)


def _ipc(run_dir: Path, instance: str, stream: str) -> str:
    path = run_dir / f"{instance}.{stream}"
    _check_ipc_length(str(path), "run directory")
    return f"ipc://{path}"


def _check_ipc_length(path: str, what: str) -> None:
    if len(path.encode()) > _MAX_IPC_PATH:
        raise LaunchError(f"{what} {Path(path).parent} is too deep for an ipc:// socket "
                          f"({path} is over {_MAX_IPC_PATH} bytes): pass a shorter --run-dir")


def _one(values: list[int] | list[str]) -> int | str | list[int] | list[str]:
    """A single replica's value as a scalar (tidier resolved files), else the list."""
    return values[0] if len(values) == 1 else values


def move_engine(plan: Plan, name: str, port_free: PortFree | None = None) -> Plan | None:
    """The plan with engine instance ``name`` on the next free port from
    ``launcher.base_port``, when another program took its port since planning (the
    launcher checks before each restart); ``None`` while its port is free."""
    port_free = port_free or port_is_free
    i, proc = next((k, p) for k, p in enumerate(plan.engines) if p.spec.name == name)
    cfg = plan.config
    instances = cfg.instances()
    e = cfg.engine(next(x.engine for x in instances if x.name == name))
    if port_free(e.host, proc.port):
        return None
    port = _free_port(e.host, cfg.launcher.base_port, cfg.claimed_ports(), port_free)
    if port is None:
        raise LaunchError(f"{name}: its port {proc.port} is taken and no port is free "
                          f"from launcher.base_port {cfg.launcher.base_port} upwards")
    ports = [port if x.name == name else x.port for x in instances if x.engine == e.name]
    draft = dataclasses.replace(cfg, engines=[
        dataclasses.replace(x, port=_one(ports)) if x.name == e.name else x
        for x in cfg.engines])
    config = parse_cluster_config(draft.to_dict(), cfg.source, plan.run_dir)
    inst = next(x for x in config.instances() if x.name == name)
    argv = list(proc.spec.argv)
    argv[argv.index("--port") + 1] = str(port)
    spec = dataclasses.replace(proc.spec, argv=argv, health_url=inst.url + "/health")
    engines = list(plan.engines)
    engines[i] = dataclasses.replace(proc, spec=spec, port=port)
    return dataclasses.replace(plan, config=config, engines=engines)


def _free_port(host: str, start: int, taken: set[int], port_free: PortFree) -> int | None:
    """The first port from ``start`` that is neither ``taken`` nor in use; None if none."""
    for port in range(start, 65536):
        if port not in taken and port_free(host, port):
            return port
    return None


def port_is_free(host: str, port: int) -> bool:
    """Whether a TCP server could listen on ``host:port`` now. With ``SO_REUSEADDR``, as
    the engines' and the router's servers bind: connections of a process that just died
    (TIME_WAIT) do not hold its port, a listener does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# ---------------------------------------------------------------- placement


def place_gpus(cfg: ClusterConfig, visible: list[int]) -> dict[str, list[int]]:
    """GPU ids of each local instance: pinned ones as given, the others (largest tensor
    parallel groups first) on the least-loaded GPUs with room for their memory share."""
    load = {g: 0.0 for g in visible}
    out: dict[str, list[int]] = {}
    auto: list[tuple[EngineConfig, str]] = []
    for e in cfg.engines:
        if e.remote:
            continue
        for r in range(e.replicas):
            name = f"{e.name}-{r}"
            if e.gpus is None:
                auto.append((e, name))
                continue
            chunk = e.gpus[r * e.tensor_parallel_size:(r + 1) * e.tensor_parallel_size]
            for g in chunk:
                if g not in load:
                    raise LaunchError(f"{cfg.source}: engines.{e.name}.gpus: GPU {g} is not "
                                      f"visible (visible: {format_ids(visible)})")
                load[g] += e.gpu_memory_utilization
            out[name] = chunk
    for e, name in sorted(auto, key=lambda a: -a[0].tensor_parallel_size):
        tp, share = e.tensor_parallel_size, e.gpu_memory_utilization
        room = sorted((g for g in visible if load[g] + share <= 1 + 1e-9),
                      key=lambda g: (load[g], g))
        if len(room) < tp:
            raise LaunchError(f"{cfg.source}: engines.{e.name}: {name} needs {tp} GPU(s) "
                              f"with {share:g} of their memory free; {len(room)} of the "
                              f"{len(visible)} visible GPUs have it")
        chunk = sorted(room[:tp])
        for g in chunk:
            load[g] += share
        out[name] = chunk
    return out


def place_cpus(cfg: ClusterConfig, cores: list[int], warnings: list[str]
               ) -> dict[str, list[int]]:
    """CPU cores of each local instance: pinned ones as given, the others disjoint slices
    of the remaining cores (``num_cpus`` each, or an even share); if there are not
    enough cores the instances share them, with a warning."""
    out: dict[str, list[int]] = {}
    auto: list[tuple[str, int | None]] = []
    for e in cfg.engines:
        if e.remote:
            continue
        per = len(e.cpus) // e.replicas if e.cpus else 0
        for r in range(e.replicas):
            name = f"{e.name}-{r}"
            if e.cpus is None:
                auto.append((name, e.num_cpus))
                continue
            chunk = e.cpus[r * per:(r + 1) * per]
            missing = [c for c in chunk if c not in cores]
            if missing:
                raise LaunchError(f"{cfg.source}: engines.{e.name}.cpus: core(s) "
                                  f"{format_ids(missing)} not available here (available: "
                                  f"{format_ids(cores)})")
            out[name] = chunk
    pinned = {c for chunk in out.values() for c in chunk}
    free = [c for c in cores if c not in pinned]
    n_even = sum(1 for _, n in auto if n is None)
    spare = len(free) - sum(n for _, n in auto if n is not None)
    start = 0
    if spare >= n_even:
        shares = iter([spare // n_even + (k < spare % n_even) for k in range(n_even)])
        for name, n in auto:
            n = n or next(shares)
            out[name] = free[start:start + n]
            start += n
    else:
        pool = free or cores
        warnings.append(f"{len(auto)} engine instance(s) share {len(pool)} CPU core(s) "
                        f"({format_ids(pool)}): they will slow each other down")
        for name, n in auto:
            out[name] = [pool[(start + j) % len(pool)] for j in range(min(n or 1, len(pool)))]
            start += n or 1
    return out


def _omp_bind(cores: list[int], tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``tp`` ranks: the cores split into ``tp`` groups."""
    if tp <= 1:
        return format_ids(cores)
    if len(cores) < tp:
        return "|".join(str(cores[r % len(cores)]) for r in range(tp))
    size = len(cores) // tp
    return "|".join(format_ids(cores[r * size:(r + 1) * size]) for r in range(tp))
