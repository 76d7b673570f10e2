"""The cluster file (``cluster.toml``): schema, validation, and the resolved form.

One TOML file describes a cluster; the launcher and the router both load it with
``load_cluster_config``. Tables: ``[router]`` (listen address, policy and its settings,
predictor artifacts), ``[[engines]]`` (one entry per model deployment, with replicas) and
``[launcher]`` (run directory, ports, health timeout, restarts, grace period) and
``[cluster]`` (where the launcher runs the engines: this machine or a Ray cluster). The keys
are the fields of the dataclasses below; docs/cluster.md documents every one of them.

Relative paths in the file are relative to the file's folder. Ports and telemetry
endpoints may be left out: the launcher assigns them and writes a *resolved* file
(``to_toml``) in which every one is set; ``instances()`` needs that resolved form.
Every default address is loopback (``127.0.0.1``) or ``ipc://``.

The tables are decoded by ``router.settings`` (types and bounds declared on the fields);
the checks across fields and engines are the ``_check_*`` functions below. Errors raise
``ConfigError`` with the message ``<file>: <key path>: <what is wrong>``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

import tomli_w
from pydantic import Field, TypeAdapter
from pydantic.dataclasses import dataclass

from engine_ext.telemetry import is_loopback_endpoint, publisher_binds, subscriber_binds
from router.policies.registry import validate_settings
from router.settings import (STRICT, Count, Niceness, Port, Positive, PositiveInt, SettingsError,
                             decode, suggest)

LOOPBACK = "127.0.0.1"
SchedPolicy = Literal["stjf", "fcfs", "priority", "mlfq"]
SCHED_POLICIES = get_args(SchedPolicy)
"""Engine scheduler policies (``engine_ext.serve --sched-policy``)."""
MAX_REPLICAS = 4096
MAX_WORKERS = 256
"""Most replicas one ``[[engines]]`` entry may ask for."""
RESERVED_MODEL_NAMES = ("auto",)
"""Served model names the router keeps for itself."""
MAX_NODE_CHARS = 1024
"""Longest ``node`` of an engine (where it runs: an address and a Ray node id)."""
BUILTIN_PREFIX = "builtin:"
TINY_KV_CACHE_BYTES = 64 * 2**20
"""Default CPU KV cache of a built-in tiny model (``builtin:tiny-*``)."""
CPU_KV_CACHE_BYTES = 2**30
"""Default CPU KV cache of any other model."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class ConfigError(ValueError):
    """An invalid cluster file; ``str()`` is ``<file>: <key path>: <what is wrong>``."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source = source
        self.key = key
        self.problem = problem


# ---------------------------------------------------------------- schema


@dataclass(frozen=True, config=STRICT)
class RouterConfig:
    """``[router]``: the router process."""

    policy: str
    """Routing policy name (``router.policies``' registry), e.g. ``chimera``."""
    host: str = LOOPBACK
    port: Port | None = None
    """TCP port; assigned by the launcher when left out."""
    uds: str | None = None
    """Also listen on this unix socket path."""
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    """Router processes serving ``port`` together, one per core: the kernel spreads the
    clients' connections over them (``SO_REUSEPORT``). Each reads the engines' telemetry
    itself; they share the program table and the launcher's and operators' engine marks
    (``router.dispatch.peers``). The launcher starts them all; by hand, run
    ``python -m router --worker I`` for I in 0..workers-1."""
    worker_ports: list[Port] | None = None
    """Each worker's own port on ``host`` (its ``/health``, ``/metrics`` and admin, one
    process each); assigned by the launcher when left out."""
    sync_dir: str | None = None
    """Directory of the workers' ipc sockets (the shared program table); the launcher sets
    its run directory."""
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The raw ``[router.policies.<name>]`` tables, validated by ``router.policies``."""
    predictors: dict[str, str] = field(default_factory=dict)
    """Predictor artifact paths by predictor name."""
    heartbeat_timeout_s: Positive = 2.0
    """An engine with no telemetry for this long is marked down."""
    scheduler_stall_timeout_s: Positive = 30.0
    """An engine whose telemetry (sent by a thread apart from its scheduler) shows the same
    scheduler step for this long while requests run or wait is down until the step moves
    (a stalled scheduler; ``router.state.engines``)."""
    allow_client_priority: bool = False
    """Whether a client may set the engine priority itself."""
    telemetry_interval_ms: Positive = 20.0
    """Engines' minimum time between two scheduler snapshots while busy."""
    request_timeout_s: Positive = 600.0
    """Longest silence from an engine on any request (a non-streamed one sends nothing
    until its generation ends)."""
    stream_first_byte_timeout_s: Positive = 300.0
    """Longest wait for a streamed response's first event (the engine's queueing and
    prefill included); beyond it the stream ends with an error event and the engine is
    marked down until its health probe answers."""
    stream_stall_timeout_s: Positive = 60.0
    """Longest silence between two events of a streamed response that has started (a
    hung or stopped engine); beyond it, as for the first byte."""
    breaker_backoff_s: Positive = 1.0
    """An engine marked down by a failed call is probed (``GET /health``) after this long,
    doubling with every further trip before it completes a request
    (``router.dispatch.health_probe.backoff``)."""
    breaker_backoff_max_s: Positive = 30.0
    """The longest such backoff."""
    max_inflight: PositiveInt = 4096
    """Generation requests the router handles at once (also its connections to engines);
    one more is answered 503 with ``retry-after`` at once instead of queueing."""
    program_ttl_s: Positive = 600.0
    """A workflow program with no request for this long leaves the program table."""
    api_keys_file: str | None = None
    """API keys of the OpenAI endpoints, one per line (``router.auth``); none: open."""
    api_keys_env: str | None = None
    """An environment variable holding API keys, comma-separated."""
    admin_keys_file: str | None = None
    """Keys of the admin endpoints; none: loopback and unix-socket callers only."""
    admin_keys_env: str | None = None
    trusted_keys_file: str | None = None
    """API keys whose callers are trusted with priority: their workflow position
    (``workflow``, ``stage``, ``stage_index``, ``num_stages``, ``final``) and, with
    ``allow_client_priority``, their ``priority`` are used; other keys' are ignored and the
    router ranks those calls on its own predictions (``router.request.RANKING_FIELDS``).
    Trusted keys are API keys too. With no key configured at all, every caller is trusted."""
    trusted_keys_env: str | None = None
    """An environment variable holding trusted API keys, comma-separated."""
    telemetry_keys_dir: str | None = None
    """CURVE keys of the telemetry plane (``python -m engine_ext.curve DIR``): every
    engine's snapshots and KV events are encrypted and authenticated both ways
    (``engine_ext.curve``). Required for a telemetry endpoint beyond loopback."""
    insecure: bool = False
    """Allow a listener beyond loopback without API keys, and telemetry endpoints beyond
    loopback without ``telemetry_keys_dir`` (cleartext, anyone who reaches them can
    read and inject frames)."""


@dataclass(frozen=True, config=STRICT)
class EngineConfig:
    """One ``[[engines]]`` entry: a model deployment of ``replicas`` engine instances.

    An entry with ``url`` is *remote*: an engine another host runs (for example with
    ``python -m launcher FILE --only NAME``); it is not started, only routed to, and its
    name is that engine's id (``NAME-0`` for the first replica of ``NAME``).
    Per-replica keys (``port``, ``telemetry_endpoint``, ``kv_events_endpoint``) take one
    value or a list with one value per replica.
    """

    name: str
    served_model_name: str
    """Model name clients use; defaults to ``name``."""
    model: str | None = None
    """``builtin:<name>``, a local path (``/``, ``./``, ``../``, ``~``) or a hub id."""
    url: str | None = None
    """Base URL of a remote engine (``http://host:port``)."""
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    host: str = LOOPBACK
    port: Port | list[Port] | None = None
    telemetry_endpoint: str | list[str] | None = None
    kv_events_endpoint: str | list[str] | None = None
    gpus: list[Count] | None = None
    """GPU ids, ``tensor_parallel_size`` per replica, in replica order."""
    num_gpus: PositiveInt | None = None
    """GPUs per replica, auto-packed onto the visible GPUs (sets the TP size)."""
    tensor_parallel_size: PositiveInt = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Share of each of its GPUs' memory an instance may take (vLLM's setting)."""
    cpus: list[Count] | None = None
    """CPU cores (no GPU visible), split evenly over the replicas."""
    num_cpus: PositiveInt | None = None
    """CPU cores per replica (no GPU visible); default: an even share of the free cores."""
    nice: Niceness = 0
    """CPU scheduling niceness (Linux ``nice``, 0-19) of the engine's processes. Where the
    router and its predictors share the engines' CPU cores (a CPU-only machine), a positive
    value keeps routing decisions from waiting behind the engines' compute."""
    kv_cache_bytes: PositiveInt | None = None
    """KV cache size; default on CPU: 64 MiB for ``builtin:tiny-*``, else 1 GiB."""
    sched_policy: SchedPolicy | None = None
    starvation_threshold: PositiveInt | None = None
    quantum: PositiveInt | None = None
    max_promotions: Count | None = None
    mlfq_levels: PositiveInt | None = None
    mlfq_base_quantum: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    dtype: str | None = None
    enforce_eager: bool = False
    load_format: str | None = None
    seed: Count | None = None
    extra_args: list[str] = field(default_factory=list)
    """Any other ``vllm serve`` arguments, passed unchanged."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of the engine process."""
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    """An environment variable holding the API key the engine requires (vLLM's own
    ``--api-key``): the launcher gives it to the engine (as ``VLLM_API_KEY``, never on a
    command line), the router sends it (``Authorization: Bearer``) on every call. The
    variable must be set where the launcher and the router run."""
    resources: dict[Annotated[str, Field(min_length=1, max_length=128)],
                    Annotated[float, Field(gt=0, le=1e6)]] = field(default_factory=dict)
    """Ray custom resources each replica needs (``[cluster] backend = "ray"``), e.g.
    ``{ "gpu-h100" = 1 }``: the replica goes only to a node that offers them."""
    node: Annotated[str, Field(max_length=MAX_NODE_CHARS)] | None = None
    """Where a remote engine runs (informational: shown by ``/health`` and ``/metrics``);
    the launcher sets it for engines it placed on a Ray cluster."""

    @property
    def remote(self) -> bool:
        return self.url is not None


@dataclass(frozen=True, config=STRICT)
class LauncherConfig:
    """``[launcher]``: how the launcher runs the cluster (the router ignores it)."""

    run_dir: str | None = None
    """Logs, sockets and the resolved file; default ``runs/<timestamp>`` in the cwd."""
    base_port: Annotated[int, Field(ge=1024, le=65535)] = 8100
    """Automatic ports are the free ones from here upwards."""
    health_timeout_s: Positive = 600.0
    """How long a starting engine or router may take to answer ``/health``."""
    grace_period_s: Positive = 10.0
    """Shutdown: time for in-flight requests and exits before SIGKILL."""
    max_restarts: Count = 5
    """Restarts of one process before the launcher gives up on it."""
    restart_backoff_s: Positive = 1.0
    """Delay before the first restart; doubles with every further one."""
    restart_backoff_max_s: Positive = 60.0
    health_interval_s: Positive = 5.0
    """A process that is up is health-checked this often."""
    unhealthy_after: PositiveInt = 3
    """Failed health checks in a row after which a process is wedged: killed, restarted."""
    stable_s: Positive = 600.0
    """A process up this long gets its restart budget and backoff back."""


@dataclass(frozen=True, config=STRICT)
class BackendConfig:
    """``[cluster]``: where the launcher runs the engines (the router ignores it)."""

    backend: Literal["local", "ray"] = "local"
    """``local``: processes on this machine, placed on its GPUs or CPU cores. ``ray``:
    each replica a Ray actor owning its engine process, in a placement group of its own
    on any node of a running Ray cluster that has the replica's resources
    (``launcher.ray_backend``, docs/cluster.md "A cluster on Ray")."""
    address: str = "auto"
    """The Ray cluster (``ray.init(address=...)``): ``auto`` (the one this machine
    belongs to), ``HOST:PORT`` of its head, or ``ray://HOST:PORT`` (Ray client)."""
    namespace: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] = "hetserve"
    """Ray namespace of the launcher's actors."""
    telemetry_host: str | None = None
    """The address engines on other nodes reach the router's telemetry sockets at;
    default: this node's address as Ray knows it. Beyond loopback it needs
    ``[router] telemetry_keys_dir`` (or ``insecure``)."""
    placement_timeout_s: Positive = 120.0
    """How long a replica may wait for a node with its resources before the launcher
    reports that it does not fit."""


@dataclasses.dataclass(frozen=True)
class EngineInstance:
    """One engine process (a replica of an entry), as the router sees it."""

    name: str
    """The engine id in telemetry and KV events: ``<engine>-<replica>`` (e.g. ``big-0``);
    a remote engine's entry name is its engine id."""
    engine: str
    replica: int
    model: str | None
    served_model_name: str
    url: str
    """Base URL the router sends requests to."""
    port: int
    telemetry_endpoint: str
    kv_events_endpoint: str
    max_model_len: int | None
    max_num_seqs: int | None
    remote: bool
    api_key_env: str | None = None
    node: str | None = None


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster file."""

    source: str
    """The file it was loaded from (names it in errors)."""
    router: RouterConfig
    engines: list[EngineConfig]
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    cluster: BackendConfig = field(default_factory=BackendConfig)

    def engine(self, name: str) -> EngineConfig:
        for e in self.engines:
            if e.name == name:
                return e
        raise KeyError(name)

    def instances(self) -> list[EngineInstance]:
        """One ``EngineInstance`` per replica; needs every port and endpoint set."""
        out = []
        for e in self.engines:
            key = f"engines.{e.name}"
            ports = [urlsplit(e.url).port or 0] if e.url else _replica_ports(e)
            tele = _replica_values(e.telemetry_endpoint, e.replicas)
            kv = _replica_values(e.kv_events_endpoint, e.replicas)
            for k, values in (("port", ports), ("telemetry_endpoint", tele),
                              ("kv_events_endpoint", kv)):
                if values is None:
                    raise ConfigError(self.source, f"{key}.{k}", "not set; the launcher "
                                      "assigns it (run the cluster with `python -m launcher`)")
            assert ports is not None and tele is not None and kv is not None
            for i in range(e.replicas):
                out.append(EngineInstance(
                    name=e.name if e.remote else f"{e.name}-{i}", engine=e.name, replica=i,
                    model=e.model,
                    served_model_name=e.served_model_name,
                    url=e.url.rstrip("/") if e.url else http_url(e.host, ports[i]),
                    port=ports[i], telemetry_endpoint=tele[i], kv_events_endpoint=kv[i],
                    max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs,
                    remote=e.remote, api_key_env=e.api_key_env, node=e.node))
        return out

    def claimed_ports(self) -> set[int]:
        """Ports of this machine the file gives (listeners and loopback TCP endpoints)."""
        return set(_port_owners(self))

    def router_url(self) -> str:
        if self.router.port is None:
            raise ConfigError(self.source, "router.port", "not set; the launcher assigns it")
        return http_url(self.router.host, self.router.port)

    def to_dict(self) -> dict[str, Any]:
        """The file's tables, with the values that differ from the defaults."""
        return {
            "router": _table(self.router),
            "engines": [_table(e) for e in self.engines],
            "launcher": _table(self.launcher),
            "cluster": _table(self.cluster),
        }

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


ENGINE_FLAGS: dict[str, str] = {
    "sched_policy": "--sched-policy",
    "starvation_threshold": "--starvation-threshold",
    "quantum": "--quantum",
    "max_promotions": "--max-promotions",
    "mlfq_levels": "--mlfq-levels",
    "mlfq_base_quantum": "--mlfq-base-quantum",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "dtype": "--dtype",
    "enforce_eager": "--enforce-eager",
    "load_format": "--load-format",
    "seed": "--seed",
}
"""Engine keys passed through as the engine server flag of the same name."""

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

_REMOTE_KEYS = frozenset({"name", "url", "model", "served_model_name", "replicas",
                          "telemetry_endpoint", "kv_events_endpoint", "max_model_len",
                          "max_num_seqs", "api_key_env", "node"})
_MANAGED_ENV = {"CUDA_VISIBLE_DEVICES": "gpus", "VLLM_CPU_OMP_THREADS_BIND": "cpus",
                "VLLM_API_KEY": "api_key_env"}


# ---------------------------------------------------------------- loading


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster file; raise ``ConfigError`` naming file and key."""
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(source, "(file)", f"cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "(syntax)", str(e)) from None
    except (RecursionError, MemoryError, ValueError) as e:  # ValueError: an int too long
        raise ConfigError(source, "(syntax)", f"nested too deeply or too large "
                          f"({type(e).__name__}: {str(e)[:100]})") from None
    return parse_cluster_config(data, source, Path(path).resolve().parent)


@dataclass(frozen=True, config=STRICT)
class _File:
    """The file's top level: its tables, each decoded on its own."""

    router: dict[str, Any]
    engines: Annotated[list[Any], Field(min_length=1)]
    launcher: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)


def parse_cluster_config(data: dict[str, Any], source: str, base_dir: Path) -> ClusterConfig:
    """Validate the tables of a cluster file read from ``source`` (paths relative to
    ``base_dir``)."""
    try:
        top = decode(_File, data, "")
        router = decode(RouterConfig, top.router, "router")
        launcher = decode(LauncherConfig, top.launcher, "launcher")
        backend = decode(BackendConfig, top.cluster, "cluster")
        engines = [_parse_engine(source, i, raw, base_dir) for i, raw in enumerate(top.engines)]
    except SettingsError as e:
        raise ConfigError(source, e.key, e.problem) from None
    router = dataclasses.replace(
        router,
        uds=_abs(router.uds, base_dir),
        sync_dir=_abs(router.sync_dir, base_dir),
        api_keys_file=_abs(router.api_keys_file, base_dir),
        admin_keys_file=_abs(router.admin_keys_file, base_dir),
        trusted_keys_file=_abs(router.trusted_keys_file, base_dir),
        telemetry_keys_dir=_abs(router.telemetry_keys_dir, base_dir),
        predictors={k: _abs(v, base_dir) for k, v in router.predictors.items()},
        policies={name: _abs_paths(table, base_dir) for name, table in router.policies.items()},
    )
    launcher = dataclasses.replace(launcher, run_dir=_abs(launcher.run_dir, base_dir))
    cfg = ClusterConfig(source=source, router=router, engines=engines, launcher=launcher,
                        cluster=backend)
    if not router.policy.strip():
        raise ConfigError(source, "router.policy", "must not be empty")
    if (not is_loopback(router.host) and not router.insecure
            and not any((router.api_keys_file, router.api_keys_env,
                         router.trusted_keys_file, router.trusted_keys_env))):
        raise ConfigError(source, "router.host", f"{router.host!r} listens beyond loopback "
                          "without API keys: set api_keys_file or api_keys_env, or "
                          "insecure = true")
    _check_backend(cfg)
    _check_workers(cfg)
    _check_names(cfg)
    _port_owners(cfg)
    _check_endpoints(cfg)
    _check_gpu_shares(cfg)
    _check_cpu_overlap(cfg)
    _check_policy(cfg)
    return cfg


def _parse_engine(source: str, index: int, raw: Any, base_dir: Path) -> EngineConfig:
    """One ``[[engines]]`` table; its keys are named ``engines.<name>`` once the name is
    known to be valid, ``engines[<index>]`` before."""
    name = raw.get("name") if isinstance(raw, dict) else None
    valid = isinstance(name, str) and _NAME_RE.match(name) is not None
    table = {"served_model_name": name, **raw} if isinstance(raw, dict) else raw
    if isinstance(table, dict) and "num_gpus" in table and "tensor_parallel_size" not in table:
        table["tensor_parallel_size"] = table["num_gpus"]
    e = decode(EngineConfig, table, f"engines.{name}" if valid else f"engines[{index}]")
    if not valid:
        raise ConfigError(source, f"engines[{index}].name", f"{e.name[:80]!r}: use letters, "
                          "digits, '_', '.' and '-', starting with a letter or digit")
    key = f"engines.{name}"

    if e.remote:
        for k in table:
            if k not in _REMOTE_KEYS:
                raise ConfigError(source, f"{key}.{k}", "not allowed for a remote engine "
                                  "(one with `url`): its own host sets it")
        for k in ("telemetry_endpoint", "kv_events_endpoint"):
            if k not in table:
                raise ConfigError(source, f"{key}.{k}", "required for a remote engine (one "
                                  "with `url`): the endpoint its engine publishes to")
        _check_url(source, f"{key}.url", e.url or "")
        if e.replicas != 1:
            raise ConfigError(source, f"{key}.replicas", "a remote engine is one instance; "
                              "give each remote replica its own [[engines]] entry")
    elif e.model is None:
        raise ConfigError(source, f"{key}.model", "missing: give a model (or `url` for an "
                          "engine another host runs)")
    else:
        e = dataclasses.replace(e, model=_check_model(source, f"{key}.model", e.model,
                                                      base_dir))
    _check_engine_values(source, key, e)
    return e


def _check_engine_values(source: str, key: str, e: EngineConfig) -> None:
    if e.served_model_name in RESERVED_MODEL_NAMES:
        raise ConfigError(source, f"{key}.served_model_name",
                          f"{e.served_model_name!r} is reserved by the router")
    if isinstance(e.port, list) and len(e.port) != e.replicas:
        raise ConfigError(source, f"{key}.port", f"gives {len(e.port)} ports for "
                          f"{e.replicas} replicas")
    if (isinstance(e.port, int) and e.port + e.replicas - 1 > 65535):
        raise ConfigError(source, f"{key}.port", f"{e.port} + {e.replicas} replicas goes "
                          "beyond TCP port 65535")
    _check_placement(source, key, e)
    for k in ("telemetry_endpoint", "kv_events_endpoint"):
        values = getattr(e, k)
        if isinstance(values, list) and len(values) != e.replicas:
            raise ConfigError(source, f"{key}.{k}", f"gives {len(values)} endpoints for "
                              f"{e.replicas} replicas")
        for ep in _replica_values(values, e.replicas) or []:
            if not ep.startswith(("ipc://", "tcp://")):
                raise ConfigError(source, f"{key}.{k}",
                                  f"{ep!r}: expected ipc://PATH or tcp://HOST:PORT")
            if not isinstance(values, list) and e.replicas > 1 and publisher_binds(ep):
                raise ConfigError(source, f"{key}.{k}", f"{ep!r} is bound by each engine, so "
                                  f"the {e.replicas} replicas need one each: give a list")
    for i, arg in enumerate(e.extra_args):
        flag = arg.split("=", 1)[0].replace("_", "-") if arg.startswith("-") else None
        if flag in MANAGED_FLAGS:
            raise ConfigError(source, f"{key}.extra_args[{i}]", f"{arg!r} is set by the "
                              f"launcher; use the key `{MANAGED_FLAGS[flag]}`")
    for var, k in _MANAGED_ENV.items():
        if var in e.env:
            raise ConfigError(source, f"{key}.env.{var}", f"set by the launcher; use `{k}`")


def _check_placement(source: str, key: str, e: EngineConfig) -> None:
    tp = e.tensor_parallel_size
    if e.gpus is not None and e.num_gpus is not None:
        raise ConfigError(source, f"{key}.num_gpus", "give either gpus or num_gpus, not both")
    if e.num_gpus is not None and e.num_gpus != tp:
        problem = (f"tensor_parallel_size {tp} is larger than the {e.num_gpus} GPUs given"
                   if tp > e.num_gpus else
                   f"{e.num_gpus} GPUs per replica but tensor_parallel_size is {tp}")
        raise ConfigError(source, f"{key}.tensor_parallel_size", problem)
    if e.gpus is not None:
        if len(e.gpus) < tp:
            raise ConfigError(source, f"{key}.tensor_parallel_size", f"tensor_parallel_size "
                              f"{tp} is larger than the {len(e.gpus)} GPUs given in gpus")
        if len(e.gpus) != tp * e.replicas:
            raise ConfigError(source, f"{key}.gpus", f"gives {len(e.gpus)} GPUs; "
                              f"{e.replicas} replicas x tensor_parallel_size {tp} "
                              f"need {tp * e.replicas}")
        for r, chunk in enumerate(_chunks(e.gpus, e.replicas)):
            if len(set(chunk)) != len(chunk):
                raise ConfigError(source, f"{key}.gpus",
                                  f"replica {r} is given the same GPU twice: {chunk}")
    if e.cpus is not None:
        if e.num_cpus is not None:
            raise ConfigError(source, f"{key}.num_cpus", "give either cpus or num_cpus, "
                              "not both")
        if not e.cpus or len(e.cpus) % e.replicas:
            raise ConfigError(source, f"{key}.cpus", f"gives {len(e.cpus)} cores, not a "
                              f"positive multiple of the {e.replicas} replicas")
        if len(set(e.cpus)) != len(e.cpus):
            raise ConfigError(source, f"{key}.cpus", "cores must be distinct")


def _check_model(source: str, key: str, spec: str, base_dir: Path) -> str:
    """The model spec, with a local path made absolute; raise if it cannot exist."""
    if spec.startswith(BUILTIN_PREFIX):
        known = _builtin_models()
        name = spec[len(BUILTIN_PREFIX):]
        if known is not None and name not in known:
            raise ConfigError(source, key, f"unknown built-in model {spec!r}"
                              f"{suggest(name, known, BUILTIN_PREFIX)}; available: "
                              + ", ".join(BUILTIN_PREFIX + n for n in known))
        return spec
    path = base_dir / Path(spec).expanduser()
    if spec.startswith(("/", "./", "../", "~")) or spec in (".", "..") or path.exists():
        if not path.exists():
            raise ConfigError(source, key, f"local model path {spec!r} does not exist "
                              f"(looked for {os.path.normpath(path)})")
        return os.path.normpath(path)
    return spec


def _check_url(source: str, key: str, url: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(source, key, f"{url!r}: expected http://HOST:PORT")


def _check_names(cfg: ClusterConfig) -> None:
    seen: dict[str, str] = {}
    models: dict[str, EngineConfig] = {}
    for i, e in enumerate(cfg.engines):
        if e.name in seen:
            raise ConfigError(cfg.source, f"engines[{i}].name",
                              f"{e.name!r} is already the name of another engine")
        seen[e.name] = e.name
        other = models.setdefault(e.served_model_name, e)
        if other is not e and None not in (other.model, e.model) and other.model != e.model:
            raise ConfigError(cfg.source, f"engines.{e.name}.served_model_name",
                              f"{e.served_model_name!r} is also served by engines.{other.name}"
                              f" with another model ({other.model!r} vs {e.model!r})")


def _port_owners(cfg: ClusterConfig) -> dict[int, str]:
    """The given ports of this machine with the key of each; raise if two share one."""
    owners: dict[int, str] = {}

    def claim(port: int, key: str) -> None:
        if port in owners:
            raise ConfigError(cfg.source, key, f"port clash: {port} is also used by "
                              f"{owners[port]}")
        owners[port] = key

    if cfg.router.port is not None:
        claim(cfg.router.port, "router.port")
    for i, port in enumerate(cfg.router.worker_ports or []):
        claim(port, f"router.worker_ports[{i}]")
    endpoints: set[str] = set()
    for e in cfg.engines:
        key = f"engines.{e.name}"
        if e.remote:
            parts = urlsplit(e.url or "")
            if parts.hostname in ("127.0.0.1", "localhost", "::1") and parts.port:
                claim(parts.port, f"{key}.url")
        for i, port in enumerate(_replica_ports(e) or []):
            claim(port, f"{key}.port" + (f" (replica {i})" if e.replicas > 1 else ""))
        for k, _, ep in _endpoints_of(e):
            port = _tcp_loopback_port(ep)
            if port is not None and ep not in endpoints:
                endpoints.add(ep)
                claim(port, f"{key}.{k}")
    return owners


def _endpoints_of(e: EngineConfig) -> Iterator[tuple[str, str, str]]:
    """Each replica's telemetry and KV-event endpoint: (key, owner, endpoint), the owner
    naming the replica when there are several."""
    for k in ("telemetry_endpoint", "kv_events_endpoint"):
        values = _replica_values(getattr(e, k), e.replicas) or []
        for i, ep in enumerate(values):
            yield k, f"engines.{e.name}.{k}" + (f" (replica {i})" if len(values) > 1 else ""), ep


_RAY_PLACED = ("host", "port", "gpus", "cpus", "telemetry_endpoint", "kv_events_endpoint")
"""Keys of an engine that the Ray backend sets itself (the replica's node decides)."""


def with_engine(cfg: ClusterConfig, table: Mapping[str, Any]) -> ClusterConfig:
    """``cfg`` with one more engine entry: a replica the launcher started while the router
    runs (``POST /admin/engines/{name}/add``). It must be an entry with a ``url``, a new
    instance name and a model already served (a new model needs a router restart: its
    policy was built for the models it had); checked as in a file (ConfigError)."""
    source = f"{cfg.source} (added engine)"
    e = _parse_engine(source, len(cfg.engines), dict(table), Path(cfg.source).parent)
    key = f"engines.{e.name}"
    if not e.remote:
        raise ConfigError(source, f"{key}.url", "an added engine needs its url")
    if e.name in {i.name for i in cfg.instances()}:
        raise ConfigError(source, f"{key}.name", f"{e.name!r} is already an engine instance")
    if e.served_model_name not in {x.served_model_name for x in cfg.engines}:
        raise ConfigError(source, f"{key}.served_model_name", f"{e.served_model_name!r} is "
                          "not served here; a new model needs a restart of the router")
    new = dataclasses.replace(cfg, source=source, engines=[*cfg.engines, e])
    _check_names(new)
    _port_owners(new)
    _check_endpoints(new)
    return dataclasses.replace(new, source=cfg.source)


def without_engine(cfg: ClusterConfig, name: str) -> ClusterConfig:
    """``cfg`` without the engine entry ``name``: one with a ``url`` (the launcher's
    placed or added replicas), not the last of its model (ConfigError)."""
    e = next((x for x in cfg.engines if x.name == name), None)
    if e is None or not e.remote:
        raise ConfigError(cfg.source, f"engines.{name}", "no engine entry of that name with a "
                          "url (only engines the launcher placed or added can be removed)")
    if sum(x.replicas for x in cfg.engines if x.served_model_name == e.served_model_name) == 1:
        raise ConfigError(cfg.source, f"engines.{name}", f"the last engine of model "
                          f"{e.served_model_name!r}")
    return dataclasses.replace(cfg, engines=[x for x in cfg.engines if x is not e])


def _check_backend(cfg: ClusterConfig) -> None:
    """Ray resources need the Ray backend; engines it places take their node's address,
    a port free there and the launcher's telemetry endpoints, and GPU or core counts,
    not ids."""
    ray = cfg.cluster.backend == "ray"
    if ray and cfg.router.workers > 1:
        raise ConfigError(cfg.source, "router.workers", 'with [cluster] backend = "ray" one '
                          "router process reads the engines' telemetry (each engine sends to "
                          "one socket of the router's host)")
    for e in cfg.engines:
        key = f"engines.{e.name}"
        if e.resources and not ray:
            raise ConfigError(cfg.source, f"{key}.resources", "Ray resources need "
                              '[cluster] backend = "ray"')
        if not ray or e.remote:
            continue
        for k in _RAY_PLACED:
            value = getattr(e, k)
            if value is not None and (k != "host" or value != LOOPBACK):
                hint = {"gpus": "num_gpus", "cpus": "num_cpus"}.get(k)
                raise ConfigError(cfg.source, f"{key}.{k}", "set by the Ray backend from the "
                                  "node each replica lands on" + (f"; give `{hint}`" if hint
                                                                  else ""))


def _check_workers(cfg: ClusterConfig) -> None:
    """Several router processes: each needs its own port, connects to every engine's
    streams (an endpoint the router would bind takes one process only), and none keeps
    per-program state beyond the shared program table."""
    r = cfg.router
    if r.worker_ports is not None and len(r.worker_ports) != r.workers:
        raise ConfigError(cfg.source, "router.worker_ports", f"gives {len(r.worker_ports)} "
                          f"ports for {r.workers} workers")
    if r.workers == 1:
        return
    if r.uds:
        raise ConfigError(cfg.source, "router.uds", "a unix socket is served by one process; "
                          "leave it out with workers > 1")
    if r.policy == "vinelm":
        raise ConfigError(cfg.source, "router.workers", "vinelm keeps each program's plan in "
                          "its router process; run one worker")
    for e in cfg.engines:
        for k, _, ep in _endpoints_of(e):
            if subscriber_binds(ep):
                raise ConfigError(cfg.source, f"engines.{e.name}.{k}", f"{ep!r} is bound by "
                                  f"the router, which {r.workers} workers cannot share: use "
                                  "ipc://, or tcp://*:PORT bound by the engine")


def _check_endpoints(cfg: ClusterConfig) -> None:
    """An endpoint an engine binds belongs to one engine and one stream; one the router
    binds (tcp to a host) may be shared by engines of one stream only. One beyond
    loopback needs CURVE keys (``telemetry_keys_dir``) unless ``insecure``."""
    streams: dict[str, tuple[str, str]] = {}
    r = cfg.router
    for e in cfg.engines:
        for k, owner, ep in _endpoints_of(e):
            if not (is_loopback_endpoint(ep) or r.telemetry_keys_dir or r.insecure):
                raise ConfigError(cfg.source, owner, f"{ep!r} is beyond loopback: anyone "
                                  "who reaches it could read or inject telemetry; set "
                                  "[router] telemetry_keys_dir (keys from python -m "
                                  "engine_ext.curve DIR), or insecure = true")
            if ep in streams:
                prev_owner, prev_kind = streams[ep]
                if publisher_binds(ep) or prev_kind != k:
                    raise ConfigError(cfg.source, owner, f"endpoint clash: {ep!r} is also "
                                      f"{prev_owner}")
            streams.setdefault(ep, (owner, k))


def _check_gpu_shares(cfg: ClusterConfig) -> None:
    """Instances pinned to one GPU must fit in its memory together."""
    users: dict[int, list[tuple[str, float]]] = {}
    for e in cfg.engines:
        if e.gpus is None:
            continue
        for r, chunk in enumerate(_chunks(e.gpus, e.replicas)):
            for g in chunk:
                users.setdefault(g, []).append((f"{e.name}-{r}", e.gpu_memory_utilization))
                total = sum(u for _, u in users[g])
                if total > 1 + 1e-9:
                    parts = " + ".join(f"{n} ({u:g})" for n, u in users[g])
                    raise ConfigError(
                        cfg.source, f"engines.{e.name}.gpus",
                        f"GPU {g} is shared beyond its memory: {parts} = {total:g} of "
                        "gpu_memory_utilization > 1; lower it or move an engine")


def _check_cpu_overlap(cfg: ClusterConfig) -> None:
    owner: dict[int, str] = {}
    for e in cfg.engines:
        for c in e.cpus or []:
            if c in owner:
                raise ConfigError(cfg.source, f"engines.{e.name}.cpus",
                                  f"core {c} is also given to engines.{owner[c]}")
            owner[c] = e.name


def _check_policy(cfg: ClusterConfig) -> None:
    """Hand each policy table to the router's policy registry."""
    validate = _policy_validator()
    if validate is None:
        return
    tables = {cfg.router.policy: {}, **cfg.router.policies}
    for name, table in tables.items():
        try:
            validate(name, table)
        except SettingsError as e:
            named_by_policy = e.key == f"router.policies.{name}" and name not in cfg.router.policies
            raise ConfigError(cfg.source, "router.policy" if named_by_policy else e.key,
                              e.problem) from None


def _policy_validator() -> Callable[[str, Mapping[str, Any]], Any] | None:
    """The policy registry's validator (a hook: tests of the file alone set it to None)."""
    return validate_settings


def _builtin_models() -> Collection[str] | None:
    if importlib.util.find_spec("engine_ext.builtin_models") is None:
        return None
    return getattr(importlib.import_module("engine_ext.builtin_models"), "BUILTIN_MODELS",
                   None)


# ---------------------------------------------------------------- helpers


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def http_url(host: str, port: int) -> str:
    """URL to reach a server listening on ``host`` (wildcards reached via loopback)."""
    host = LOOPBACK if host in _WILDCARD_HOSTS else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def default_kv_cache_bytes(model: str | None) -> int:
    """CPU KV cache size for an engine that does not set ``kv_cache_bytes``."""
    if model is not None and model.startswith(BUILTIN_PREFIX + "tiny-"):
        return TINY_KV_CACHE_BYTES
    return CPU_KV_CACHE_BYTES


def _replica_ports(e: EngineConfig) -> list[int] | None:
    """One port per replica: a list as given, or consecutive ports from one port."""
    if e.port is None:
        return None
    if isinstance(e.port, list):
        return e.port
    return [e.port + i for i in range(e.replicas)]


def _replica_values(value: str | list[str] | None, replicas: int) -> list[str] | None:
    if value is None or isinstance(value, list):
        return value
    return [value] * replicas


def _chunks(items: list[int], n: int) -> list[list[int]]:
    size = len(items) // n
    return [items[i * size:(i + 1) * size] for i in range(n)]


def _tcp_loopback_port(endpoint: str) -> int | None:
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1", "*") or not port.isdigit():
        return None
    return int(port)


def _abs(path: str | None, base_dir: Path) -> str | None:
    if path is None:
        return None
    return os.path.normpath(base_dir / Path(path).expanduser())


def _abs_paths(table: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A policy table with its non-empty ``*_path`` strings made absolute."""
    return {k: _abs(v, base_dir) if k.endswith("_path") and isinstance(v, str) and v else v
            for k, v in table.items()}


def _table(obj: Any) -> dict[str, Any]:
    """The settings' keys whose values differ from their defaults."""
    return TypeAdapter(type(obj)).dump_python(obj, exclude_defaults=True)
