"""The cluster file as the launcher reads it: the router's (``router.config``) with
``[launcher]`` (run directory, ports, health checks, restarts) and ``[cluster]`` (where
the engines run: this machine or a Ray cluster) typed, the engine server flags the
launcher sets, and the rules of placing the engines (``LaunchConfig.verify``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from router.config.addresses import LOOPBACK
from router.config.cluster import (ClusterConfig, ConfigError, absolute, decode_tables,
                                   read_cluster_file)
from router.config.engines import HETSERVE_ONLY_KEYS, LocalEngine
from router.settings import (STRICT, Count, Name, Positive, PositiveInt, SettingsError, check,
                             decode, encode)


@dataclass(frozen=True, config=STRICT)
class LauncherConfig:
    """``[launcher]``: how the launcher runs the cluster."""

    run_dir: str | None = None
    """Logs, sockets and the resolved file; default ``runs/<timestamp>`` in the cwd."""
    base_port: Annotated[int, Field(ge=1024, le=65535)] = 8100
    """Automatic ports are the free ones from here upwards."""
    health_timeout_s: Positive = 600.0
    """How long a starting engine or router may take to answer ``/health``."""
    grace_period_s: Positive = 10.0
    """Shutdown: time for in-flight requests and exits before SIGKILL."""
    max_restarts: Count = 5
    """Restarts of one process within ``restart_window_s`` after which the launcher gives
    up on it."""
    restart_backoff_s: Positive = 1.0
    """Delay before the first restart; doubles with every further one."""
    restart_backoff_max_s: Positive = 60.0
    health_interval_s: Positive = 5.0
    """A process that is up is health-checked this often."""
    unhealthy_after: PositiveInt = 3
    """Failed health checks in a row after which a process is wedged: killed, restarted."""
    restart_window_s: Positive = 600.0
    """``max_restarts`` and the backoff count the restarts of the last this many seconds
    (a sliding window, as systemd's ``StartLimitIntervalSec``): a crash loop is given up
    on, a process that faults now and then never is."""
    restart_yield_nice: Annotated[int, Field(ge=0, le=19)] = 10
    """Engines on CPU cores: while one restarts, the niceness added to the others that are
    up (their session's Linux autogroup), so the engines carrying the load do not starve
    the restart; 0: off."""


@dataclass(frozen=True, config=STRICT)
class EngineCluster:
    """``[cluster]``: the machines the launcher runs the engines on."""

    backend: Literal["local", "ray"] = "local"
    """``local``: processes on this machine, placed on its GPUs or CPU cores. ``ray``:
    each replica a Ray actor owning its engine process, in a placement group of its own
    on any node of a running Ray cluster that has the replica's resources
    (``launcher.ray_backend``, docs/cluster.md "A cluster on Ray")."""
    address: str = "auto"
    """The Ray cluster (``ray.init(address=...)``): ``auto`` (the one this machine
    belongs to), ``HOST:PORT`` of its head, or ``ray://HOST:PORT`` (Ray client)."""
    namespace: Name = "hetserve"
    """Ray namespace of the launcher's actors."""
    telemetry_host: str | None = None
    """The address engines on other nodes reach the router's telemetry sockets at;
    default: this node's address as Ray knows it. Beyond loopback it needs
    ``[router] telemetry_keys_dir`` (or ``insecure``)."""
    placement_timeout_s: Positive = 120.0
    """How long a replica may wait for a node with its resources before the launcher
    reports that it does not fit."""


ENGINE_FLAGS: dict[str, str] = {
    "sched_policy": "--sched-policy",
    "starvation_threshold": "--starvation-threshold",
    "quantum": "--quantum",
    "max_promotions": "--max-promotions",
    "mlfq_levels": "--mlfq-levels",
    "mlfq_base_quantum": "--mlfq-base-quantum",
    "retention_ttl_s": "--retention-ttl-s",
    "retention_slack": "--retention-slack",
    "max_protected_programs": "--max-protected-programs",
    "max_protected_fraction": "--max-protected-fraction",
    "retention_ttl_only": "--retention-ttl-only",
    "admit_returning_first": "--admit-returning-first",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "dtype": "--dtype",
    "enforce_eager": "--enforce-eager",
    "load_format": "--load-format",
    "seed": "--seed",
}
"""Engine keys passed through as the engine server flag of the same name."""
STOCK_ENGINE_FLAGS: dict[str, str] = {k: flag for k, flag in ENGINE_FLAGS.items()
                                      if k != "sched_policy" and k not in HETSERVE_ONLY_KEYS}
"""The keys passed to a stock vLLM server (``kind = "vllm"``): vLLM's own flags."""

MANAGED_FLAGS: dict[str, str] = {
    **{flag: key for key, flag in ENGINE_FLAGS.items()},
    "--model": "model",
    "--engine-id": "name",
    "--host": "host",
    "--port": "port",
    "--served-model-name": "served_model_name",
    "--api-key": "api_key_env",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-memory-bytes": "kv_cache_bytes",
    "--telemetry-endpoint": "telemetry_endpoint",
    "--telemetry-interval-ms": "router.telemetry_interval_ms",
    "--kv-events-endpoint": "kv_events_endpoint",
    "--kv-events-config": "kv_events_endpoint",
}
"""Flags the launcher sets itself, with the key that sets them; not allowed in extra_args."""

_MANAGED_ENV = {"CUDA_VISIBLE_DEVICES": "gpus", "VLLM_CPU_OMP_THREADS_BIND": "cpus",
                "VLLM_API_KEY": "api_key_env"}
"""Environment variables the launcher sets itself, with the key that sets them."""

_RAY_PLACED = ("host", "port", "gpus", "cpus", "telemetry_endpoint", "kv_events_endpoint")
"""Keys of an engine that the Ray backend sets itself (the replica's node decides)."""


@dataclasses.dataclass(frozen=True)
class LaunchConfig(ClusterConfig):
    """A validated cluster file, as the launcher reads it."""

    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    cluster: EngineCluster = field(default_factory=EngineCluster)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "launcher": encode(self.launcher),
                "cluster": encode(self.cluster)}

    def verify(self) -> None:
        """The router's rules, then the launcher's (SettingsError naming the key): no
        flag or environment variable the launcher sets; the Ray backend's placement; GPUs
        shared within their memory, CPU cores given once."""
        super().verify()
        self._verify_managed()
        self._verify_backend()
        self._verify_gpu_shares()
        self._verify_cpu_overlap()

    def _verify_managed(self) -> None:
        for e in self.engines:
            if not isinstance(e, LocalEngine):
                continue
            key = f"engines.{e.name}"
            for i, arg in enumerate(e.extra_args):
                flag = arg.split("=", 1)[0].replace("_", "-") if arg.startswith("-") else None
                check(f"{key}.extra_args[{i}]", flag not in MANAGED_FLAGS, f"{arg!r} is set "
                      f"by the launcher; use the key `{MANAGED_FLAGS.get(flag or '')}`")
            for var, k in _MANAGED_ENV.items():
                check(f"{key}.env.{var}", var not in e.env, f"set by the launcher; use `{k}`")

    def _verify_backend(self) -> None:
        """Ray resources need the Ray backend; engines it places take their node's address,
        a port free there and the launcher's telemetry endpoints, and GPU or core counts,
        not ids."""
        ray = self.cluster.backend == "ray"
        check("router.workers", not ray or self.router.workers == 1, 'with [cluster] backend '
              '= "ray" one router process reads the engines\' telemetry (each engine sends to '
              "one socket of the router's host)")
        for e in self.engines:
            if not isinstance(e, LocalEngine):
                continue
            key = f"engines.{e.name}"
            check(f"{key}.kind", not ray or e.kind == "hetserve", 'the Ray backend starts '
                  'hetserve engines; run a stock vLLM server yourself and give its `url`')
            check(f"{key}.resources", ray or not e.resources,
                  'Ray resources need [cluster] backend = "ray"')
            if not ray:
                continue
            for k in _RAY_PLACED:
                value = getattr(e, k)
                hint = {"gpus": "num_gpus", "cpus": "num_cpus"}.get(k)
                check(f"{key}.{k}", value is None or (k == "host" and value == LOOPBACK),
                      "set by the Ray backend from the node each replica lands on"
                      + (f"; give `{hint}`" if hint else ""))

    def _verify_gpu_shares(self) -> None:
        """Instances pinned to one GPU must fit in its memory together."""
        users: dict[int, list[tuple[str, float]]] = {}
        for e in self.engines:
            if not isinstance(e, LocalEngine) or e.gpus is None:
                continue
            for r, chunk in enumerate(replica_chunks(e.gpus, e.replicas)):
                for g in chunk:
                    users.setdefault(g, []).append((f"{e.name}-{r}", e.gpu_memory_utilization))
                    total = sum(u for _, u in users[g])
                    parts = " + ".join(f"{n} ({u:g})" for n, u in users[g])
                    check(f"engines.{e.name}.gpus", total <= 1 + 1e-9,
                          f"GPU {g} is shared beyond its memory: {parts} = {total:g} of "
                          "gpu_memory_utilization > 1; lower it or move an engine")

    def _verify_cpu_overlap(self) -> None:
        owner: dict[int, str] = {}
        for e in self.engines:
            for c in (e.cpus or [] if isinstance(e, LocalEngine) else []):
                check(f"engines.{e.name}.cpus", c not in owner,
                      f"core {c} is also given to engines.{owner.get(c)}")
                owner[c] = e.name


def replica_chunks(items: list[int], n: int) -> list[list[int]]:
    """``items`` (GPUs or cores) split evenly over ``n`` replicas, in order."""
    size = len(items) // n
    return [items[i * size:(i + 1) * size] for i in range(n)]


def load_launch_config(path: str | os.PathLike[str]) -> LaunchConfig:
    """Read and validate a cluster file; raise ``ConfigError`` naming file and key."""
    return parse_launch_config(read_cluster_file(path), str(path),
                               Path(path).resolve().parent)


def parse_launch_config(data: dict[str, Any], source: str, base_dir: Path) -> LaunchConfig:
    """Validate the tables of a cluster file read from ``source`` (paths relative to
    ``base_dir``), the launcher's included."""
    try:
        router, engines = decode_tables(data, base_dir)
        launcher = decode(LauncherConfig, data.get("launcher", {}), "launcher")
        launch = LaunchConfig(
            source=source, router=router, engines=engines,
            launcher=dataclasses.replace(launcher, run_dir=absolute(launcher.run_dir,
                                                                    base_dir)),
            cluster=decode(EngineCluster, data.get("cluster", {}), "cluster"))
        launch.verify()
    except SettingsError as e:
        raise ConfigError(source, e.key, e.problem) from None
    return launch
