"""The local backend: engines on this machine's GPUs or CPU cores.

Engines are placed on GPUs (``CUDA_VISIBLE_DEVICES``, tensor parallel groups packed onto
the least-loaded GPUs) or, with no GPU visible, on disjoint CPU core sets
(``VLLM_CPU_OMP_THREADS_BIND``, ``--kv-cache-memory-bytes``), each on a port of its own
and ipc:// telemetry sockets in the run directory. A process runs in a session of its
own under a ``LocalProcess`` handle; one whose port another program took is moved to the
next free port before its restart (``move_engine``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher import LaunchError
from launcher.backends.base import Backend
from launcher.devices import Devices, format_ids
from launcher.plan import Plan, PortPlan, ProcessPlan, engine_process, ipc_endpoint, one
from launcher.ports import PortFree, free_port, port_is_free
from launcher.process import (MARKER_ENV, ProcessHandle, ProcessSpec, ProcessTree,
                              describe_exit, set_session_nice, spawn, tail_file)
from launcher.settings import EngineCluster, LaunchConfig, parse_launch_config
from router.config.engines import EngineConfig


class LocalProcess:
    """A process started here, in a session of its own (``launcher.process.spawn``)."""

    where = "local"

    def __init__(self, spec: ProcessSpec, run_dir: Path, restarts: int = 0) -> None:
        """Start ``spec`` with the cluster's marker (``MARKER_ENV``); its log is
        appended to after a restart."""
        with open(spec.log_path, "ab" if restarts else "wb") as log:
            if restarts:
                log.write(f"\n---- launcher: restart {restarts} ----\n".encode())
                log.flush()
            popen = spawn(spec.argv, {**os.environ, **spec.env, MARKER_ENV: str(run_dir)},
                          stdout=log, nice=spec.nice, pass_fds=spec.pass_fds)
        self.tree = ProcessTree(popen)
        self.pid = popen.pid
        self.health_url = spec.health_url
        self.log_path = spec.log_path

    def poll(self) -> str | None:
        self.tree.remember()
        code = self.tree.popen.poll()
        return None if code is None else describe_exit(code)

    def terminate(self) -> None:
        self.tree.terminate()

    def alive(self) -> bool:
        return self.tree.alive()

    def kill(self) -> None:
        self.tree.kill()
        self.tree.reap()

    def renice(self, nice: int) -> bool:
        return set_session_nice(self.pid, nice)

    def tail(self, lines: int) -> str:
        return tail_file(self.log_path, lines)

    def moved_from(self, before: ProcessHandle) -> str | None:
        return None  # a move here is planned before the restart (LocalBackend.replan)


class LocalBackend(Backend):
    """Engines on this machine."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    @classmethod
    def connect(cls, cluster: EngineCluster, run_dir: Path) -> LocalBackend:
        return cls(run_dir)

    @classmethod
    def resolve_engines(cls, cfg: LaunchConfig, run_dir: Path, ports: PortPlan
                        ) -> list[EngineConfig]:
        """Each local entry's ports (from ``launcher.base_port`` unless given) and ipc://
        telemetry sockets in ``run_dir`` (unless given)."""
        engines = []
        for e in cfg.engines:
            if e.remote:
                engines.append(e)
                continue
            names = [f"{e.name}-{i}" for i in range(e.replicas)]
            if e.port is None:
                port: int | list[int] = one([ports.alloc(e.host) for _ in names])
            else:
                port = e.port
                for p in port if isinstance(port, list) else [port + i
                                                              for i in range(e.replicas)]:
                    ports.check_free(f"engines.{e.name}.port", e.host, p)
            tele = None if e.kind == "vllm" else e.telemetry_endpoint or one(
                [ipc_endpoint(run_dir, n, "telemetry") for n in names])
            keyless = e.kind == "vllm" and cfg.router.telemetry_keys_dir  # see verify_engines
            kv = None if keyless else e.kv_events_endpoint or one(
                [ipc_endpoint(run_dir, n, "kv") for n in names])
            engines.append(dataclasses.replace(e, port=port, telemetry_endpoint=tele,
                                               kv_events_endpoint=kv))
        return engines

    @classmethod
    def plan_engines(cls, cfg: LaunchConfig, run_dir: Path, python: str,
                     devices: Devices | None, telemetry_host: str | None,
                     port_free: PortFree, warnings: list[str]) -> list[ProcessPlan]:
        """Each local instance on its GPUs (``place_gpus``) or CPU cores
        (``place_cpus``)."""
        assert devices is not None
        if devices.gpus:
            placed = place_gpus(cfg, devices.gpus)
        else:
            placed = place_cpus(cfg, devices.cpus, warnings)
        engines = []
        for inst in cfg.instances():
            if inst.remote:
                continue
            e = cfg.engine(inst.engine)
            ids = placed[inst.name]
            if devices.gpus:
                env, where = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}, "gpu"
            else:
                env = {"VLLM_CPU_OMP_THREADS_BIND": _omp_bind(ids, e.tensor_parallel_size)}
                where = "cpu"
            engines.append(engine_process(
                cfg, e, inst, run_dir, python, gpu=bool(devices.gpus), env=env,
                health_url=inst.url + "/health", devices=f"{where} {format_ids(ids)}"))
        return engines

    @classmethod
    def describe(cls, cfg: LaunchConfig, devices: Devices | None) -> str:
        assert devices is not None
        return devices.describe()

    def start(self, spec: ProcessSpec, restarts: int = 0) -> LocalProcess:
        if spec.placement is not None:
            raise LaunchError(f"{spec.name}: it is placed on a cluster, and this backend "
                              "runs processes here (no remote_start)")
        return LocalProcess(spec, self.run_dir, restarts)

    def fit(self, placements: Sequence[tuple[str, Any]]) -> list[str]:
        return []

    def replan(self, plan: Plan, name: str) -> tuple[Plan, str] | None:
        """An engine whose port another program took moves to the next free one."""
        if not any(p.spec.name == name for p in plan.engines):
            return None  # the router
        moved = move_engine(plan, name)
        if moved is None:
            return None
        old = next(p for p in plan.engines if p.spec.name == name)
        new = next(p for p in moved.engines if p.spec.name == name)
        return moved, f"port {old.port} is taken; restarting on port {new.port}"


BACKEND = LocalBackend


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
        dataclasses.replace(x, port=one(ports)) if x.name == e.name else x
        for x in cfg.engines])
    config = parse_launch_config(draft.to_dict(), cfg.source, plan.run_dir)
    inst = next(x for x in config.instances() if x.name == name)
    argv = list(proc.spec.argv)
    argv[argv.index("--port") + 1] = str(port)
    spec = dataclasses.replace(proc.spec, argv=argv, health_url=inst.url + "/health")
    engines = list(plan.engines)
    engines[i] = dataclasses.replace(proc, spec=spec, port=port)
    return dataclasses.replace(plan, config=config, engines=engines)


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
