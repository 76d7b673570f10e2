"""The Ray backend: engines on a Ray cluster (``[cluster] backend = "ray"``).

Each engine replica is a Ray actor (``EngineHost``) that owns the replica's engine
process, in a placement group of its own: one bundle per tensor-parallel rank
(``{"GPU": 1}``; a CPU engine has one bundle of ``num_cpus`` CPUs), the replica's custom
``resources`` and the host's CPU in the first, ``STRICT_PACK`` so a replica never spans
nodes. The host holds the first bundle (and its GPU); a ``GpuLease`` actor holds each
other rank's GPU and reports its id, so the engine process sees all of the replica's
GPUs (``CUDA_VISIBLE_DEVICES``), as vLLM's multiprocessing executor expects. The host
picks a port free on its node, starts ``python -m engine_ext.serve`` there on the node's
address (in a session of its own, under ``launcher.reaper``, which takes the engine's
whole process group down if the actor dies) and answers the
supervisor's polls through ``RayProcess`` (the router runs on the launcher's machine,
under a ``LocalProcess``). A replica whose process, actor or node dies is
re-placed by the supervisor: its group is removed and a new one placed on any node with
room, so a replica of a lost node comes back on another.

The actors and groups belong to the launcher's Ray job: Ray removes them if the launcher
dies; ``RayBackend.close`` removes them on a normal stop. Ray is an optional extra
(``pip install hetserve[ray]``), imported only here and only when this backend is used.

Planning needs no Ray: each replica's ``RayPlacement`` and its command with its node's
address and port left open (``NODE_HOST``, ``NODE_PORT``); its address is known once it
runs (``placed`` turns it into the entry the router loads).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher import LaunchError
from launcher.backends.base import Backend
from launcher.backends.local import LocalProcess
from launcher.devices import Devices
from launcher.plan import (NODE_HOST, NODE_PORT, Plan, PortPlan, ProcessPlan, engine_process,
                           placed_entry)
from launcher.ports import PortFree, port_is_free, take_port
from launcher.process import (MARKER_ENV, ProcessHandle, ProcessSpec, ProcessTree,
                              describe_exit, spawn, tail_file)
from launcher.settings import EngineCluster, LaunchConfig, parse_launch_config
from router.config.addresses import is_loopback
from router.config.engines import EngineConfig, EngineInstance
CALL_TIMEOUT_S = 10.0
"""Longest wait for one answer of a host actor (a poll, a stop)."""
ACTOR_START_TIMEOUT_S = 120.0
"""Longest wait for a placed replica's host actor to start and answer (Ray spawns a worker
process for it: seconds on a busy node). Not ``placement_timeout_s``, which bounds the
wait for a node with room: a short placement timeout must not fail a slow start."""
_DROPPED_ENV = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
"""Variables Ray sets for its workers that would mislead the engine (vLLM sizes its own
threads; the replica's GPUs are set from its leases)."""


@dataclasses.dataclass(frozen=True)
class RayPlacement:
    """What one replica asks of the Ray cluster, and where it reports."""

    bundles: list[dict[str, float]]
    """Its placement group's bundles; the first is the host actor's."""
    gpus: int
    """GPUs (one per bundle) the engine process sees."""
    base_port: int
    """Its engine port is the first free one from here on its node."""
    avoid_ports: frozenset[int]
    """Ports of the launcher's host to leave alone when the node is that host."""
    telemetry_endpoint: str
    kv_events_endpoint: str
    """Where its engine sends telemetry and KV events: the router's sockets."""

    def describe(self) -> str:
        first = {k: v for k, v in self.bundles[0].items() if k not in ("CPU", "GPU")}
        parts = [f"{self.gpus} GPU" if self.gpus else
                 f"{self.bundles[0].get('CPU', 0):g} CPU"]
        parts += [f"{k}={v:g}" for k, v in sorted(first.items())]
        return "ray " + ", ".join(parts)


def placement(num_gpus: int, num_cpus: int, resources: Mapping[str, float],
              base_port: int, avoid_ports: frozenset[int], telemetry_endpoint: str,
              kv_events_endpoint: str) -> RayPlacement:
    """The placement of a replica with ``num_gpus`` GPUs (0: a CPU engine of ``num_cpus``
    cores) and ``resources``."""
    if num_gpus:
        bundles = [{"GPU": 1.0, "CPU": 1.0, **resources}] + [{"GPU": 1.0}] * (num_gpus - 1)
    else:
        bundles = [{"CPU": float(num_cpus), **resources}]
    return RayPlacement(bundles, num_gpus, base_port, avoid_ports, telemetry_endpoint,
                        kv_events_endpoint)


class EngineHost:
    """The Ray actor that owns one engine process on its node."""

    def __init__(self) -> None:
        self.tree: ProcessTree | None = None
        self.log_path: Path | None = None

    def node(self) -> tuple[str, str]:
        """This node's address and Ray id."""
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def gpu_ids(self) -> list[str]:
        return _gpu_ids()

    def start(self, argv: list[str], env: dict[str, str], log_path: str, base_port: int,
              taken: list[int], gpu_ids: list[str]) -> tuple[int, int]:
        """Start the engine on a free port of this node; its (port, pid)."""
        host = self.node()[0]
        port = take_port(host, base_port, set(taken), port_is_free)
        argv = [sys.executable, "-m", "launcher.reaper", sys.executable,
                *(host if a == NODE_HOST else str(port) if a == NODE_PORT else a
                  for a in argv[1:])]
        full = {k: v for k, v in os.environ.items()
                if not k.startswith("RAY_") and k not in _DROPPED_ENV}
        full.update(env)
        if gpu_ids:
            full["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"---- launcher: on {host} port {port} ----\n".encode())
            log.flush()
            self.tree = ProcessTree(spawn(argv, full, stdout=log))
        return port, self.tree.popen.pid

    def poll(self) -> int | None:
        assert self.tree is not None
        self.tree.remember()
        return self.tree.popen.poll()

    def alive(self) -> bool:
        assert self.tree is not None
        self.tree.remember()
        return self.tree.alive()

    def terminate(self) -> None:
        assert self.tree is not None
        self.tree.terminate()

    def kill(self) -> None:
        """SIGKILL the process's tree."""
        assert self.tree is not None
        self.tree.kill()
        self.tree.reap()

    def tail(self, lines: int) -> str:
        return "(not started)" if self.log_path is None else tail_file(self.log_path, lines)


class GpuLease:
    """Holds one more GPU of a tensor-parallel replica and tells its id."""

    def gpu_ids(self) -> list[str]:
        return _gpu_ids()


def _gpu_ids() -> list[str]:
    """The GPUs Ray gave the calling actor."""
    import ray

    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


class RayProcess:
    """A placed engine's handle (``launcher.process.ProcessHandle``)."""

    def __init__(self, name: str, host: Any, leases: list[Any], group: Any, address: str,
                 node_id: str, port: int, pid: int) -> None:
        self.name = name
        self.host, self.leases, self.group = host, leases, group
        self.address, self.node_id, self.port, self.pid = address, node_id, port, pid
        self.url = f"http://{address}:{port}"
        self.health_url = self.url + "/health"
        self.where = f"{address} ({node_id[:8]})"
        self._released = False

    def moved_from(self, before: ProcessHandle) -> str | None:
        if not isinstance(before, RayProcess) or (before.url, before.where) == (
                self.url, self.where):
            return None
        return f"re-placed on {self.where} at {self.url} (was {before.where} at {before.url})"

    def poll(self) -> str | None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self._released:
            return "released"
        try:
            code = ray.get(self.host.poll.remote(), timeout=CALL_TIMEOUT_S)
        except GetTimeoutError:
            return None  # a slow node: its health checks decide
        except RayActorError as e:
            return f"lost its Ray actor or node ({type(e).__name__})"
        return None if code is None else describe_exit(code)

    def _call(self, method: str, default: Any, *args: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self._released:
            return default
        try:
            return ray.get(getattr(self.host, method).remote(*args), timeout=CALL_TIMEOUT_S)
        except (GetTimeoutError, RayActorError):
            return default

    def terminate(self) -> None:
        self._call("terminate", None)

    def alive(self) -> bool:
        return bool(self._call("alive", False))

    def kill(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._released:
            return
        self._call("kill", None)
        self._released = True
        for actor in [self.host, *self.leases]:
            ray.kill(actor)
        remove_placement_group(self.group)

    def tail(self, lines: int) -> str:
        return str(self._call("tail", "(its node is unreachable: no log)", lines))

    def renice(self, nice: int) -> bool:
        """Not done (False): Ray places an engine on its node's resources, not on cores it shares
        with a restart (``yield_nice`` is for engines on this machine's cores)."""
        return False


class RayBackend(Backend):
    """The launcher's connection to a Ray cluster: places replicas, removes them."""

    scales = True

    def __init__(self, cfg: EngineCluster, run_dir: Path, timeout_s: float | None = None
                 ) -> None:
        """Connect to the cluster ``cfg`` names (LaunchError if there is none). A loopback
        address is a cluster of this machine: Ray is told to keep it on loopback."""
        host = cfg.address.removeprefix("ray://").rsplit(":", 1)[0]
        if is_loopback(host):
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray
        except ImportError:
            raise LaunchError('[cluster] backend = "ray" needs Ray: pip install '
                              "'hetserve[ray]'") from None
        self.cfg = cfg
        self.run_dir = run_dir
        self.timeout_s = timeout_s or cfg.placement_timeout_s
        self.processes: list[RayProcess] = []
        self._ports: dict[str, set[int]] = {}
        """Per node address: the ports of every replica placed there, the dead ones'
        included, so that no other replica takes a port the router's file still gives
        to a replica waiting for its restart (two replicas placed on one port made the
        resolved file invalid and stopped the cluster). A replica's port is freed when it
        is placed again (a replica scaled away keeps its port until then)."""
        try:
            ray.init(address=cfg.address, namespace=cfg.namespace, log_to_driver=False,
                     logging_level="WARNING")
        except ConnectionError as e:
            raise LaunchError(f"cluster.address {cfg.address!r}: no Ray cluster to connect to "
                              f"({e}); start one with `ray start --head` or give its "
                              "address") from None
        self.address = ray.util.get_node_ip_address()
        """This node's address, as Ray knows it."""

    @classmethod
    def connect(cls, cluster: EngineCluster, run_dir: Path) -> RayBackend:
        return cls(cluster, run_dir)

    @classmethod
    def check_only(cls, only: Sequence[str]) -> None:
        if only:
            raise LaunchError('--only: with [cluster] backend = "ray" the launcher places '
                              "every engine on the Ray cluster itself; run it once, on one "
                              "host")

    @classmethod
    def resolve_engines(cls, cfg: LaunchConfig, run_dir: Path, ports: PortPlan
                        ) -> list[EngineConfig]:
        """As they are: a replica's port is found on its node, its telemetry endpoints
        when planned (``plan_engines``)."""
        return cfg.engines

    @classmethod
    def plan_engines(cls, cfg: LaunchConfig, run_dir: Path, python: str,
                     devices: Devices | None, telemetry_host: str | None,
                     port_free: PortFree, warnings: list[str]) -> list[ProcessPlan]:
        if telemetry_host is None:
            raise LaunchError("the Ray backend needs the router host's address (ray_host)")
        return ray_engines(cfg, run_dir, python, telemetry_host, port_free, warnings)

    @classmethod
    def describe(cls, cfg: LaunchConfig, devices: Devices | None) -> str:
        return f"Ray cluster {cfg.cluster.address}"

    @property
    def telemetry_host(self) -> str:
        return self.cfg.telemetry_host or self.address

    def start(self, spec: ProcessSpec, restarts: int = 0) -> ProcessHandle:
        """Place ``spec`` (its ``placement`` a ``RayPlacement``) and start its engine
        (LaunchError: no node has room within the placement timeout); a spec with no
        placement (the router) runs here."""
        if spec.placement is None:
            return LocalProcess(spec, self.run_dir, restarts)
        return self._place(spec)

    def _place(self, spec: ProcessSpec) -> RayProcess:
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        p: RayPlacement = spec.placement
        group = placement_group(p.bundles, strategy="STRICT_PACK",
                                name=f"hetserve-{self.run_dir.name}-{spec.name}")
        try:
            ray.get(group.ready(), timeout=self.timeout_s)
        except GetTimeoutError:
            remove_placement_group(group)
            raise LaunchError(f"{spec.name}: no node of the Ray cluster has room for "
                              f"{_bundles(p.bundles)} (waited {self.timeout_s:g} s)") from None

        def at(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)

        first = p.bundles[0]
        host = ray.remote(EngineHost).options(
            num_cpus=first.get("CPU", 0), num_gpus=first.get("GPU", 0),
            resources={k: v for k, v in first.items() if k not in ("CPU", "GPU")},
            scheduling_strategy=at(0), max_concurrency=1).remote()
        leases = [ray.remote(GpuLease).options(num_cpus=0, num_gpus=1,
                                               scheduling_strategy=at(i)).remote()
                  for i in range(1, len(p.bundles))]
        try:
            address, node_id = ray.get(host.node.remote(), timeout=ACTOR_START_TIMEOUT_S)
            gpus = [g for a in [host, *leases]
                    for g in ray.get(a.gpu_ids.remote(), timeout=ACTOR_START_TIMEOUT_S)] \
                if p.gpus else []
            taken = self._ports.setdefault(address, set())
            if address == self.address:
                taken |= p.avoid_ports
            before = next((q for q in reversed(self.processes) if q.name == spec.name), None)
            mine = {before.port} if before is not None and before.address == address else set()
            env = {**spec.env, MARKER_ENV: str(self.run_dir)}
            port, pid = ray.get(host.start.remote(spec.argv, env, str(spec.log_path),
                                                  p.base_port, sorted(taken - mine), gpus),
                                timeout=ACTOR_START_TIMEOUT_S)
        except Exception as e:
            for a in [host, *leases]:
                ray.kill(a)
            remove_placement_group(group)
            raise LaunchError(f"{spec.name}: could not start on its Ray node: "
                              f"{type(e).__name__}: {str(e)[:300]}") from None
        if before is not None:  # its previous run is dead: its port is free for all
            self._ports[before.address].discard(before.port)
        taken.add(port)
        proc = RayProcess(spec.name, host, leases, group, address, node_id, port, pid)
        self.processes.append(proc)
        return proc

    def fit(self, placements: Sequence[tuple[str, Any]]) -> list[str]:
        """Dry run: where each replica (its ``RayPlacement``) would go on the cluster's
        free resources now (first fit, a replica on one node), or why it does not fit."""
        free = _available_per_node()
        lines = []
        for name, p in placements:
            need = _total(p.bundles)
            node = next((n for n, have in free.items()
                         if all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items())), None)
            if node is None:
                most = {k: max((have.get(k, 0.0) for have in free.values()), default=0.0)
                        for k in need}
                lines.append(f"{name}: does not fit: needs {_fmt(need)} on one node; the "
                             f"most any node has free: {_fmt(most)}")
                continue
            for k, v in need.items():
                free[node][k] -= v
            lines.append(f"{name}: fits on node {node}")
        return lines

    def placed(self, plan: Plan, handles: Mapping[str, ProcessHandle]) -> Plan:
        return placed(plan, {name: (h.url, h.where) for name, h in handles.items()
                             if isinstance(h, RayProcess)})

    def close(self) -> None:
        """Remove every actor and placement group this launcher created."""
        import ray

        for proc in self.processes:
            proc.kill()
        ray.shutdown()


def _available_per_node() -> dict[str, dict[str, float]]:
    """Free resources of each live node (address and id), from the cluster's state."""
    import ray

    free: dict[str, dict[str, float]] = {}
    try:
        from ray._private.state import available_resources_per_node
        per_node = available_resources_per_node()
    except (ImportError, AttributeError):
        per_node = {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        have = per_node.get(n["NodeID"], n.get("Resources", {}))
        free[f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})"] = {
            k: float(v) for k, v in have.items()
            if not k.startswith(("node:", "bundle_group_")) and not k.endswith("memory")}
    return free


def _total(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _fmt(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()))


def _bundles(bundles: list[dict[str, float]]) -> str:
    return _fmt(_total(bundles))



# ---------------------------------------------------------------- planning


def ray_engines(cfg: LaunchConfig, run_dir: Path, python: str, host: str,
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
        where = placement(gpus, e.num_cpus or 1, e.resources, cfg.launcher.base_port,
                          frozenset(taken), inst.telemetry_endpoint, inst.kv_events_endpoint)
        proc = engine_process(cfg, e, inst, run_dir, python, gpu=bool(gpus), env={},
                              health_url=None, devices=where.describe(), placement=where)
        argv = proc.spec.argv
        argv[argv.index("--host") + 1] = NODE_HOST
        argv[argv.index("--port") + 1] = NODE_PORT
        out.append(proc)
    return out


def placed(plan: Plan, where: Mapping[str, tuple[str, str]]) -> Plan:
    """The plan once Ray placed its engines: ``where`` maps each instance to its base
    URL and node; each becomes an entry of its own in the router's file, with its
    URL, node and telemetry endpoints (re-validated)."""
    cfg = plan.config
    by_name = {p.spec.name: p.spec.placement for p in plan.engines}
    entries: list[dict[str, object]] = []
    for e, table in zip(cfg.engines, cfg.to_dict()["engines"]):
        if e.remote:
            entries.append(table)
            continue
        entries += [placed_entry(e, name, by_name[name].telemetry_endpoint,
                                 by_name[name].kv_events_endpoint, *where[name])
                    for name in (f"{e.name}-{r}" for r in range(e.replicas))
                    if name in where]
    draft = cfg.to_dict() | {"engines": entries}
    return dataclasses.replace(plan, config=parse_launch_config(draft, cfg.source,
                                                                 plan.run_dir))


def with_replicas(plan: Plan, name: str, replicas: int,
                  port_free: PortFree | None = None, held: Collection[int] = ()) -> Plan:
    """The plan with Ray engine entry ``name`` at ``replicas`` replicas: new ones get
    their processes (and telemetry endpoints), the last ones beyond go
    (LaunchError: no such entry placed by Ray). ``held``: ports of the telemetry host
    that placed replicas' servers hold, a dead one's too (free now, but the router's
    file gives it to the replica until its restart)."""
    cfg = plan.config
    e = next((x for x in cfg.engines if x.name == name and not x.remote), None)
    if e is None or plan.telemetry_host is None:
        raise LaunchError(f"no engine entry {name!r} placed on Ray here (entries: "
                          f"{', '.join(x.name for x in cfg.engines if not x.remote)})")
    config = dataclasses.replace(cfg, engines=[
        dataclasses.replace(x, replicas=replicas) if x is e else x for x in cfg.engines])
    keep = [p for p in plan.engines if p.spec.name not in
            {f"{name}-{r}" for r in range(replicas, e.replicas)}]
    taken = cfg.claimed_ports() | set(held) | {
        int(ep.rsplit(":", 1)[1]) for p in plan.engines
        for ep in (p.spec.placement.telemetry_endpoint, p.spec.placement.kv_events_endpoint)}
    added = ray_engines(config, plan.run_dir, plan.python, plan.telemetry_host,
                        port_free or port_is_free, [], only=(name, range(e.replicas,
                                                                        replicas)),
                        taken=taken)
    return dataclasses.replace(plan, config=config, engines=keep + added)


BACKEND = RayBackend
