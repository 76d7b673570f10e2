"""The launch plan: ports, endpoints, device placement and the command of every process.

``make_plan`` is pure apart from probing which ports are free (injectable): it resolves
the cluster file (every port and telemetry endpoint filled in, re-validated exactly as
the router will load it), places engines on GPUs (``CUDA_VISIBLE_DEVICES``, tensor
parallel groups packed onto the least-loaded GPUs) or, with no GPU visible, on disjoint
CPU core sets (``VLLM_CPU_OMP_THREADS_BIND``, ``--kv-cache-memory-bytes``), and builds
the command line and environment of each engine and of the router. With ``[cluster]
backend = "ray"`` engines are not placed here: each replica gets a ``RayPlacement``
(``launcher.ray_backend``) and TCP telemetry endpoints on ``ray_host``, and its address
is known once it runs (``Plan.placed`` turns it into the entry the router loads).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher import LaunchError
from launcher.devices import Devices, format_ids
from launcher.ports import PortFree, free_port, port_is_free, take_port
from launcher.ray_backend import NODE_HOST, NODE_PORT, RayPlacement, placement
from launcher.settings import ENGINE_FLAGS, LaunchConfig, parse_launch_config
from launcher.supervisor import ProcessSpec
from router.auth import KeysError, engine_key
from router.config.addresses import http_url, is_loopback
from router.config.engines import EngineConfig, EngineInstance, default_kv_cache_bytes
from router.dispatch.peers import sync_endpoints

RESOLVED_NAME = "cluster.resolved.toml"
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
"""Environment of every process the launcher starts: nothing contacts a model hub."""
SECRET_ENV = frozenset({"VLLM_API_KEY"})
"""Environment variables the plan never prints."""
_MAX_IPC_PATH = 107  # bytes in sockaddr_un.sun_path, less the NUL

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
    config: LaunchConfig
    """The resolved cluster file (what the router loads)."""
    run_dir: Path
    engines: list[ProcessPlan]
    routers: list[ProcessPlan]
    """The router's processes: one, or ``router.workers``; none with ``--only``."""
    remote: list[EngineInstance]
    devices: Devices
    warnings: list[str]
    ray_host: str | None = None
    """With engines on Ray: where they reach the router's telemetry sockets."""
    python: str = sys.executable

    @property
    def config_path(self) -> Path:
        return self.run_dir / RESOLVED_NAME

    def write_resolved(self) -> None:
        """Write the resolved cluster file the router processes load."""
        self.config_path.write_text(f"# Resolved by the launcher from {self.config.source}; "
                                    "the router loads this file.\n" + self.config.to_toml())

    @property
    def ray(self) -> bool:
        """Engines go to a Ray cluster (``[cluster] backend = "ray"``)."""
        return self.config.cluster.backend == "ray"

    def placed(self, where: dict[str, tuple[str, str]]) -> Plan:
        """The plan once Ray placed its engines: ``where`` maps each instance to its base
        URL and node; each becomes an entry of its own in the router's file, with its
        URL, node and telemetry endpoints (re-validated)."""
        cfg = self.config
        by_name = {p.spec.name: p for p in self.engines}
        entries: list[dict[str, object]] = []
        for e, table in zip(cfg.engines, cfg.to_dict()["engines"]):
            if e.remote:
                entries.append(table)
                continue
            entries += [placed_entry(e, name, by_name[name].spec.placement, *where[name])
                        for name in (f"{e.name}-{r}" for r in range(e.replicas))
                        if name in where]
        draft = cfg.to_dict() | {"engines": entries}
        return dataclasses.replace(self, config=parse_launch_config(draft, cfg.source,
                                                                    self.run_dir))

    def with_replicas(self, name: str, replicas: int,
                      port_free: PortFree | None = None) -> Plan:
        """The plan with Ray engine entry ``name`` at ``replicas`` replicas: new ones get
        their processes (and telemetry endpoints), the last ones beyond go
        (LaunchError: no such entry placed by Ray)."""
        cfg = self.config
        e = next((x for x in cfg.engines if x.name == name and not x.remote), None)
        if not self.ray or e is None or self.ray_host is None:
            raise LaunchError(f"no engine entry {name!r} placed on Ray here (entries: "
                              f"{', '.join(x.name for x in cfg.engines if not x.remote)})")
        config = dataclasses.replace(cfg, engines=[
            dataclasses.replace(x, replicas=replicas) if x is e else x for x in cfg.engines])
        keep = [p for p in self.engines if p.spec.name not in
                {f"{name}-{r}" for r in range(replicas, e.replicas)}]
        taken = cfg.claimed_ports() | {
            int(ep.rsplit(":", 1)[1]) for p in self.engines
            for ep in (p.spec.placement.telemetry_endpoint, p.spec.placement.kv_events_endpoint)}
        added = _ray_engines(config, self.run_dir, self.python, self.ray_host,
                             port_free or port_is_free, [], only=(name, range(e.replicas,
                                                                             replicas)),
                             taken=taken)
        return dataclasses.replace(self, config=config, engines=keep + added)

    @property
    def router(self) -> ProcessPlan | None:
        """The (first) router process."""
        return self.routers[0] if self.routers else None

    def processes(self) -> list[ProcessPlan]:
        return self.engines + self.routers

    def render(self) -> str:
        """The plan as ``--dry-run`` prints it."""
        where = (f"Ray cluster {self.config.cluster.address}" if self.ray
                 else self.devices.describe())
        lines = [f"run dir  {self.run_dir}", f"devices  {where}", ""]
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


def make_plan(cfg: LaunchConfig, devices: Devices, run_dir: Path,
              only: Sequence[str] = (), port_free: PortFree | None = None,
              python: str = sys.executable, ray_host: str | None = None) -> Plan:
    """Plan the cluster of ``cfg`` in ``run_dir`` (absolute); with ``only``, just those
    engines and no router (for a host that runs part of a cluster). ``ray_host``: the
    address engines on a Ray cluster reach the router's telemetry at (backend ray)."""
    port_free = port_free or port_is_free
    if cfg.cluster.backend == "ray" and only:
        raise LaunchError('--only: with [cluster] backend = "ray" the launcher places every '
                          "engine on the Ray cluster itself; run it once, on one host")
    cfg = _select(cfg, only)
    resolved = _resolve(cfg, run_dir, start_router=not only, port_free=port_free)
    warnings: list[str] = []
    routers = [] if only else _routers(resolved, run_dir, python)
    remote = dataclasses.replace(  # local entries placed by Ray have no port yet
        resolved, engines=[e for e in resolved.engines if e.remote]).instances()
    if resolved.cluster.backend == "ray":
        if ray_host is None:
            raise LaunchError("the Ray backend needs the router host's address (ray_host)")
        engines = _ray_engines(resolved, run_dir, python, ray_host, port_free, warnings)
        return Plan(resolved, run_dir, engines, routers, remote, devices, warnings, ray_host,
                    python)
    local = [i for i in resolved.instances() if not i.remote]
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
        engines.append(ProcessPlan(
            spec=ProcessSpec(
                name=inst.name,
                argv=engine_argv(python, resolved, e, inst, gpu=bool(devices.gpus)),
                env={**BASE_ENV, **env, **_key_env(resolved, e), **e.env},
                log_path=run_dir / f"{inst.name}.log",
                health_url=inst.url + "/health", nice=e.nice),
            kind="engine", port=inst.port, devices=f"{where} {format_ids(ids)}",
            model=inst.served_model_name))
    return Plan(resolved, run_dir, engines, routers, remote, devices, warnings)


def placed_entry(e: EngineConfig, name: str, where: RayPlacement, url: str,
                 node: str) -> dict[str, object]:
    """The router's file entry of replica ``name`` of ``e``, running at ``url`` on
    ``node`` (also the body of ``POST /admin/engines/{name}/add``)."""
    entry = {"name": name, "url": url, "model": e.model,
             "served_model_name": e.served_model_name,
             "telemetry_endpoint": where.telemetry_endpoint,
             "kv_events_endpoint": where.kv_events_endpoint,
             "max_model_len": e.max_model_len, "max_num_seqs": e.max_num_seqs,
             "api_key_env": e.api_key_env, "node": node}
    return {k: v for k, v in entry.items() if v is not None}


def _ray_engines(cfg: LaunchConfig, run_dir: Path, python: str, host: str,
                 port_free: PortFree, warnings: list[str],
                 only: tuple[str, range] | None = None,
                 taken: set[int] | None = None) -> list[ProcessPlan]:
    """One process per replica (or per replica of ``only``: an entry and its replica
    indexes), placed by Ray: its command with the node's address and port left open
    (``NODE_HOST``, ``NODE_PORT``), telemetry to the router on ``host``; ``taken``:
    ports of ``host`` in use besides the file's."""
    taken = taken if taken is not None else cfg.claimed_ports()

    def endpoint() -> str:
        base = cfg.launcher.base_port
        return f"tcp://{host}:{take_port(host, base, taken, port_free, base)}"

    replicas = [(e, EngineInstance(
        name=f"{e.name}-{r}", engine=e.name, replica=r, model=e.model,
        served_model_name=e.served_model_name, url="", port=0, telemetry_endpoint=endpoint(),
        kv_events_endpoint=endpoint(), max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs, remote=False))
        for e in cfg.engines if not e.remote
        for r in (only[1] if only and only[0] == e.name else
                  () if only else range(e.replicas))]
    if not is_loopback(host):
        warnings += [f"engines.{e.name}: its replicas listen on their Ray node's address "
                     "with no API key (set api_key_env)"
                     for e in cfg.engines if not e.remote and not e.api_key_env]
    out = []
    for e, inst in replicas:
        gpus = e.num_gpus or 0
        argv = engine_argv(python, cfg, e, inst, gpu=bool(gpus))
        argv[argv.index("--host") + 1] = NODE_HOST
        argv[argv.index("--port") + 1] = NODE_PORT
        where = placement(gpus, e.num_cpus or 1, e.resources, cfg.launcher.base_port,
                          frozenset(taken), inst.telemetry_endpoint, inst.kv_events_endpoint)
        out.append(ProcessPlan(
            spec=ProcessSpec(
                name=inst.name, argv=argv, env={**BASE_ENV, **_key_env(cfg, e), **e.env},
                log_path=run_dir / f"{inst.name}.log", health_url=None, nice=e.nice,
                placement=where),
            kind="engine", port=0, devices=where.describe(), model=e.served_model_name))
    return out


def _key_env(cfg: LaunchConfig, e: EngineConfig) -> dict[str, str]:
    """The engine's API key (``VLLM_API_KEY``), if it has one."""
    if not e.api_key_env:
        return {}
    try:
        return {"VLLM_API_KEY": engine_key(e.name, e.api_key_env)}
    except KeysError as exc:
        raise LaunchError(f"{cfg.source}: {exc}") from None


def _routers(cfg: LaunchConfig, run_dir: Path, python: str) -> list[ProcessPlan]:
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


def engine_argv(python: str, cfg: LaunchConfig, e: EngineConfig, inst: EngineInstance,
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


def _select(cfg: LaunchConfig, only: Sequence[str]) -> LaunchConfig:
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


def _resolve(cfg: LaunchConfig, run_dir: Path, start_router: bool,
             port_free: PortFree) -> LaunchConfig:
    """``cfg`` with every port and endpoint of what it starts set, as the router loads it
    (still naming the user's file in errors)."""
    taken = cfg.claimed_ports()
    next_port = [cfg.launcher.base_port]

    def alloc(host: str) -> int:
        port = take_port(host, next_port[0], taken, port_free, cfg.launcher.base_port)
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
        if e.remote or cfg.cluster.backend == "ray":  # placed by Ray: _ray_engines
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
    return parse_launch_config(draft.to_dict(), cfg.source, run_dir)


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
    port = free_port(e.host, cfg.launcher.base_port, cfg.claimed_ports(), port_free)
    if port is None:
        raise LaunchError(f"{name}: its port {proc.port} is taken and no port is free "
                          f"from launcher.base_port {cfg.launcher.base_port} upwards")
    ports = [port if x.name == name else x.port for x in instances if x.engine == e.name]
    draft = dataclasses.replace(cfg, engines=[
        dataclasses.replace(x, port=_one(ports)) if x.name == e.name else x
        for x in cfg.engines])
    config = parse_launch_config(draft.to_dict(), cfg.source, plan.run_dir)
    inst = next(x for x in config.instances() if x.name == name)
    argv = list(proc.spec.argv)
    argv[argv.index("--port") + 1] = str(port)
    spec = dataclasses.replace(proc.spec, argv=argv, health_url=inst.url + "/health")
    engines = list(plan.engines)
    engines[i] = dataclasses.replace(proc, spec=spec, port=port)
    return dataclasses.replace(plan, config=config, engines=engines)


# ---------------------------------------------------------------- placement


def place_gpus(cfg: LaunchConfig, visible: list[int]) -> dict[str, list[int]]:
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


def place_cpus(cfg: LaunchConfig, cores: list[int], warnings: list[str]
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
