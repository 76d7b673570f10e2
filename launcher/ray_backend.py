"""Engines on a Ray cluster (``[cluster] backend = "ray"``).

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
supervisor's polls through ``RayProcess``. A replica whose process, actor or node dies is
re-placed by the supervisor: its group is removed and a new one placed on any node with
room, so a replica of a lost node comes back on another.

The actors and groups belong to the launcher's Ray job: Ray removes them if the launcher
dies; ``RayBackend.close`` removes them on a normal stop. Ray is an optional extra
(``pip install hetserve[ray]``), imported only here and only when this backend is used.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from launcher import LaunchError
from launcher.ports import port_is_free, take_port
from launcher.settings import EngineCluster
from launcher.supervisor import (MARKER_ENV, ProcessSpec, alive, describe_exit, kill_procs,
                                 reap, spawn, tail_file)
from router.config.addresses import is_loopback

NODE_HOST = "<node-address>"
"""Stands in the engine's command line for its node's address (set by the host)."""
NODE_PORT = "<node-port>"
"""Stands in the engine's command line for the port the host finds free on its node."""
CALL_TIMEOUT_S = 10.0
"""Longest wait for one answer of a host actor (a poll, a stop)."""
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
        self.popen: Any = None
        self.log_path: Path | None = None
        self.seen: dict[int, psutil.Process] = {}

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
            self.popen = spawn(argv, full, stdout=log)
        return port, self.popen.pid

    def poll(self) -> int | None:
        self._remember()
        return self.popen.poll()

    def alive(self) -> bool:
        self._remember()
        return self.popen.poll() is None or any(alive(p) for p in self.seen.values())

    def terminate(self) -> None:
        self._remember()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the process's group and every descendant seen."""
        self._remember()
        kill_procs(list(self.seen.values()), self.popen, signal.SIGKILL)
        reap(self.popen, 5.0)

    def tail(self, lines: int) -> str:
        return "(not started)" if self.log_path is None else tail_file(self.log_path, lines)

    def _remember(self) -> None:
        try:
            kids = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.Error:
            return
        self.seen.update((k.pid, k) for k in kids if k.pid not in self.seen)


class GpuLease:
    """Holds one more GPU of a tensor-parallel replica and tells its id."""

    def gpu_ids(self) -> list[str]:
        return _gpu_ids()


def _gpu_ids() -> list[str]:
    """The GPUs Ray gave the calling actor."""
    import ray

    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


class RayProcess:
    """The supervisor's handle on a placed engine (``launcher.supervisor.RemoteProcess``)."""

    def __init__(self, name: str, host: Any, leases: list[Any], group: Any, address: str,
                 node_id: str, port: int, pid: int, ports: set[int]) -> None:
        """``ports``: the ports in use on its node, which it leaves when released."""
        self.name = name
        self._ports = ports
        self.host, self.leases, self.group = host, leases, group
        self.address, self.node_id, self.port, self.pid = address, node_id, port, pid
        self.url = f"http://{address}:{port}"
        self.where = f"{address} ({node_id[:8]})"
        self._released = False

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
        self._ports.discard(self.port)
        for actor in [self.host, *self.leases]:
            ray.kill(actor)
        remove_placement_group(self.group)

    def tail(self, lines: int) -> str:
        return str(self._call("tail", "(its node is unreachable: no log)", lines))


class RayBackend:
    """The launcher's connection to a Ray cluster: places replicas, removes them."""

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
        try:
            ray.init(address=cfg.address, namespace=cfg.namespace, log_to_driver=False,
                     logging_level="WARNING")
        except ConnectionError as e:
            raise LaunchError(f"cluster.address {cfg.address!r}: no Ray cluster to connect to "
                              f"({e}); start one with `ray start --head` or give its "
                              "address") from None
        self.address = ray.util.get_node_ip_address()
        """This node's address, as Ray knows it."""

    @property
    def telemetry_host(self) -> str:
        return self.cfg.telemetry_host or self.address

    def start(self, spec: ProcessSpec) -> RayProcess:
        """Place ``spec`` (its ``placement`` a ``RayPlacement``) and start its engine
        (LaunchError: no node has room within the placement timeout)."""
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
            address, node_id = ray.get(host.node.remote(), timeout=self.timeout_s)
            gpus = [g for a in [host, *leases]
                    for g in ray.get(a.gpu_ids.remote(), timeout=self.timeout_s)] \
                if p.gpus else []
            taken = self._ports.setdefault(address, set())
            if address == self.address:
                taken |= p.avoid_ports
            env = {**spec.env, MARKER_ENV: str(self.run_dir)}
            port, pid = ray.get(host.start.remote(spec.argv, env, str(spec.log_path),
                                                  p.base_port, sorted(taken), gpus),
                                timeout=self.timeout_s)
        except Exception as e:
            for a in [host, *leases]:
                ray.kill(a)
            remove_placement_group(group)
            raise LaunchError(f"{spec.name}: could not start on its Ray node: "
                              f"{type(e).__name__}: {str(e)[:300]}") from None
        taken.add(port)
        proc = RayProcess(spec.name, host, leases, group, address, node_id, port, pid, taken)
        self.processes.append(proc)
        return proc

    def fit(self, placements: Sequence[tuple[str, RayPlacement]]) -> list[str]:
        """Dry run: where each replica would go on the cluster's free resources now
        (first fit, a replica on one node), or why it does not fit."""
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

