"""``[[engines]]``: one entry per model deployment, local (``LocalEngine``, started by the
launcher) or remote (``RemoteEngine``, with a ``url``), each entry's rules in its ``verify``;
``EngineInstance``, one engine process as the router sees it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field
from pydantic.dataclasses import dataclass

from engine_ext.builtin_models import BUILTIN_MODELS, PREFIX as BUILTIN_PREFIX
from engine_ext.telemetry import publisher_binds
from router.config.addresses import LOOPBACK, HttpUrl
from router.settings import (NAME_PATTERN, STRICT, Count, Name, Niceness, Port, PositiveInt,
                             SettingsError, Verified, check, decode, suggest)
from scheduler_patches.contract import MAX_EXPECTED_RETURN_S
from scheduler_patches.protected import MAX_PROTECTED_PROGRAMS, RetentionSettings
from scheduler_patches.settings import ENGINE_POLICIES as SCHED_POLICIES
from scheduler_patches.settings import EnginePolicy as SchedPolicy

EngineKind = Literal["hetserve", "vllm"]
"""``hetserve``: vLLM with hetserve's scheduler and telemetry (``engine_ext.serve``);
``vllm``: unmodified vLLM, read by its ``/metrics`` (``router.dispatch.scraper``)."""
STOCK_SCHED_POLICIES = ("fcfs", "priority")
"""The schedulers of stock vLLM (its ``--scheduling-policy``)."""
RETENTION_KEYS = (*RetentionSettings.__pydantic_fields__, "admit_returning_first")
"""Engine keys of KV retention (``RetentionSettings``) and of the admission that uses it
(``scheduler_patches.program_admission``); a replay's policy spec may set them."""
HETSERVE_ONLY_KEYS = ("telemetry_endpoint", "starvation_threshold", "quantum",
                      "max_promotions", "mlfq_levels", "mlfq_base_quantum", *RETENTION_KEYS)
"""Keys of hetserve's engine patch, refused for a ``kind = "vllm"`` engine."""
MAX_REPLICAS = 4096
"""Most replicas of one entry."""
RESERVED_MODEL_NAMES = ("auto",)
"""Served model names the router keeps for itself."""
MAX_NODE_CHARS = 1024
"""Longest ``node`` (where an engine runs: an address and a Ray node id)."""

Endpoint = Annotated[str, Field(pattern=r"^(ipc|tcp)://")]
"""A ZeroMQ endpoint: ``ipc://PATH`` or ``tcp://HOST:PORT``."""
ENDPOINT_KEYS = ("telemetry_endpoint", "kv_events_endpoint")
"""An engine's ZeroMQ endpoints: scheduler snapshots, KV events."""
PriorityWire = Literal["none", "hetserve", "stock"]
"""How the router sends a request's ``priority``: ``none``, not at all; ``hetserve``, as it
is; ``stock``, with no prediction (``0``) sent as ``PRIORITY_MAX``."""


def priority_wire(kind: EngineKind, sched_policy: str) -> PriorityWire:
    """The ``PriorityWire`` of an engine of ``kind`` scheduled by ``sched_policy`` (also in
    the twin): none for FCFS; stock vLLM would serve a call without a prediction first,
    where STJF serves it last (``unprioritized_priority``), hence ``PRIORITY_MAX``."""
    if sched_policy == "fcfs":
        return "none"
    return "stock" if kind == "vllm" else "hetserve"


@dataclass(frozen=True, config=STRICT, kw_only=True)
class _Engine(Verified):
    """The keys of every entry."""

    name: Name
    served_model_name: str
    """Model name clients use; defaults to ``name``."""
    kind: EngineKind = "hetserve"
    """Which server the engine is (``EngineKind``; ``vllm``: started as ``vllm serve``)."""
    sched_policy: SchedPolicy | None = None
    """The engine's scheduler: hetserve's ``stjf`` (default), ``fcfs``, ``priority``,
    ``mlfq``; vllm's ``fcfs`` (default) or ``priority``. Priorities go to all but ``fcfs``."""
    model: str | None = None
    """``builtin:<name>``, a local path (``/``, ``./``, ``../``, ``~``) or a hub id."""
    replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    telemetry_endpoint: Endpoint | list[Endpoint] | None = None
    """Where the engine publishes scheduler snapshots: one, or one per replica."""
    kv_events_endpoint: Endpoint | list[Endpoint] | None = None
    """Where the engine publishes KV cache events: one, or one per replica."""
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    """A variable (set where the launcher and router run) holding the key the engine
    requires: given to it as ``VLLM_API_KEY``, sent by the router as a bearer token."""
    node: Annotated[str, Field(max_length=MAX_NODE_CHARS)] | None = None
    """Where it runs (shown by ``/health``, ``/metrics``); the launcher sets it on Ray."""

    remote: ClassVar[bool]
    """Whether another host runs it (an entry with ``url``)."""

    @property
    def priority_wire(self) -> PriorityWire:
        """``priority_wire`` of its scheduler (default: stock vLLM's FCFS, hetserve's STJF)."""
        return priority_wire(self.kind, self.sched_policy or
                             ("fcfs" if self.kind == "vllm" else "stjf"))

    def per_replica(self, key: str) -> list[str] | None:
        """One endpoint per replica of ``key`` (``telemetry_endpoint``, ...)."""
        value = getattr(self, key)
        return value if value is None or isinstance(value, list) else [value] * self.replicas

    def endpoints(self) -> list[tuple[str, str, str]]:
        """(key, owner, endpoint) of each replica's endpoints, owner naming the replica."""
        return [(k, f"engines.{self.name}.{k}" + (f" (replica {i})" if self.replicas > 1
                                                  else ""), ep)
                for k in ENDPOINT_KEYS for i, ep in enumerate(self.per_replica(k) or [])]

    def verify(self) -> None:
        check("served_model_name", self.served_model_name not in RESERVED_MODEL_NAMES,
              f"{self.served_model_name!r} is reserved by the router")
        if self.kind == "vllm":
            check("sched_policy", self.sched_policy in (None, *STOCK_SCHED_POLICIES),
                  f"stock vLLM schedules {' or '.join(STOCK_SCHED_POLICIES)} (kind = "
                  f"\"vllm\"); {self.sched_policy!r} needs kind = \"hetserve\"")
            for k in HETSERVE_ONLY_KEYS:
                check(k, getattr(self, k, None) is None, "a setting of hetserve's engine "
                      "patch; a stock vLLM engine (kind = \"vllm\") has none")
        for k in ENDPOINT_KEYS:
            given = getattr(self, k)
            check(k, not isinstance(given, list) or len(given) == self.replicas,
                  f"gives {len(given or [])} endpoints for {self.replicas} replicas")
            for ep in ([] if isinstance(given, list) or given is None else [given]):
                check(k, self.replicas == 1 or not publisher_binds(ep),
                      f"{ep!r} is bound by each engine, so the {self.replicas} replicas "
                      "need one each: give a list")


@dataclass(frozen=True, config=STRICT, kw_only=True)
class LocalEngine(_Engine):
    """An entry the launcher starts: ``replicas`` engine instances of ``model``."""

    host: str = LOOPBACK
    port: Port | list[Port] | None = None
    """One port (consecutive ones for the replicas) or one per replica."""
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
    """Niceness of the engine's processes: positive keeps routing decisions from waiting
    behind engines on CPU cores they share."""
    kv_cache_bytes: PositiveInt | None = None
    """KV cache size; default on CPU: 64 MiB for ``builtin:tiny-*``, else 1 GiB."""
    starvation_threshold: PositiveInt | None = None
    quantum: PositiveInt | None = None
    max_promotions: Count | None = None
    mlfq_levels: PositiveInt | None = None
    mlfq_base_quantum: PositiveInt | None = None
    retention_ttl_s: Annotated[float, Field(ge=0, le=MAX_EXPECTED_RETURN_S)] | None = None
    """Longest KV retention of a returning program after its call (s; 0: off; default 30):
    ``scheduler_patches.protected.RetentionSettings``."""
    retention_slack: Annotated[float, Field(ge=1, le=1000)] | None = None
    """Retention lasts this many times the call's expected return, within the TTL (2)."""
    max_protected_programs: Annotated[int, Field(ge=0, le=MAX_PROTECTED_PROGRAMS)] | None = None
    """Programs whose KV cache is retained at once (0: off; default 256)."""
    max_protected_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    """Share of the KV pool retained blocks may hold (default 0.5)."""
    retention_ttl_only: bool | None = None
    """Baseline: retain every non-final call for the TTL (Continuum's rule; default false)."""
    admit_returning_first: bool | None = None
    """STJF: under KV pressure, admit returning programs first in their level (false)."""
    max_num_batched_tokens: PositiveInt | None = None
    dtype: str | None = None
    enforce_eager: bool = False
    load_format: str | None = None
    seed: Count | None = None
    extra_args: list[str] = field(default_factory=list)
    """Any other ``vllm serve`` arguments, passed unchanged."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of the engine process."""
    resources: dict[Annotated[str, Field(min_length=1, max_length=128)],
                    Annotated[float, Field(gt=0, le=1e6)]] = field(default_factory=dict)
    """Ray custom resources each replica needs, e.g. ``{ "gpu-h100" = 1 }``."""

    remote: ClassVar[bool] = False

    @property
    def ports(self) -> list[int] | None:
        """One port per replica: the list given, or consecutive ports from the one given."""
        if self.port is None or isinstance(self.port, list):
            return self.port
        return [self.port + i for i in range(self.replicas)]

    def verify(self) -> None:
        check("model", self.model is not None, "missing: give a model (or `url` for an "
              "engine another host runs)")
        super().verify()
        check("admit_returning_first", not self.admit_returning_first
              or self.sched_policy in (None, "stjf"),
              f"reorders STJF's queue: needs sched_policy = \"stjf\", not "
              f"{self.sched_policy!r}")
        if isinstance(self.port, list):
            check("port", len(self.port) == self.replicas,
                  f"gives {len(self.port)} ports for {self.replicas} replicas")
        else:
            check("port", self.port is None or self.port + self.replicas - 1 <= 65535,
                  f"{self.port} + {self.replicas} replicas goes beyond TCP port 65535")
        self._verify_gpus()
        self._verify_cpus()

    def _verify_gpus(self) -> None:
        tp, gpus = self.tensor_parallel_size, self.gpus
        check("num_gpus", gpus is None or self.num_gpus is None,
              "give either gpus or num_gpus, not both")
        if self.num_gpus is not None:
            check("tensor_parallel_size", self.num_gpus == tp,
                  f"tensor_parallel_size {tp} is larger than the {self.num_gpus} GPUs given"
                  if tp > self.num_gpus else
                  f"{self.num_gpus} GPUs per replica but tensor_parallel_size is {tp}")
        if gpus is None:
            return
        check("tensor_parallel_size", len(gpus) >= tp, f"tensor_parallel_size {tp} is "
              f"larger than the {len(gpus)} GPUs given in gpus")
        check("gpus", len(gpus) == tp * self.replicas, f"gives {len(gpus)} GPUs; "
              f"{self.replicas} replicas x tensor_parallel_size {tp} need {tp * self.replicas}")
        for r in range(self.replicas):
            chunk = gpus[r * tp:(r + 1) * tp]
            check("gpus", len(set(chunk)) == tp, f"replica {r} is given the same GPU twice: "
                  f"{chunk}")

    def _verify_cpus(self) -> None:
        if self.cpus is None:
            return
        check("num_cpus", self.num_cpus is None, "give either cpus or num_cpus, not both")
        check("cpus", bool(self.cpus) and len(self.cpus) % self.replicas == 0,
              f"gives {len(self.cpus)} cores, not a positive multiple of the "
              f"{self.replicas} replicas")
        check("cpus", len(set(self.cpus)) == len(self.cpus), "cores must be distinct")


@dataclass(frozen=True, config=STRICT, kw_only=True)
class RemoteEngine(_Engine):
    """An engine another host runs: only routed to; its name is that engine's id
    (``NAME-0`` for the first replica of ``NAME``), its endpoints those it publishes to."""

    url: HttpUrl
    """Base URL of the engine (``http://host:port``)."""

    remote: ClassVar[bool] = True

    @property
    def ports(self) -> list[int]:
        """The port of its URL."""
        return [urlsplit(self.url).port or 0]

    def verify(self) -> None:
        for k in ENDPOINT_KEYS if self.kind == "hetserve" else ():
            check(k, getattr(self, k) is not None, "required for a remote engine (one with "
                  "`url`): the endpoint its engine publishes to (or kind = \"vllm\" for a "
                  "stock vLLM server, read by its /metrics)")
        check("replicas", self.replicas == 1, "a remote engine is one instance; give each "
              "remote replica its own [[engines]] entry")
        super().verify()


EngineConfig = LocalEngine | RemoteEngine
"""One ``[[engines]]`` entry."""


@dataclasses.dataclass(frozen=True)
class EngineInstance:
    """One engine process (a replica of an entry), as the router sees it."""

    name: str
    """Engine id in telemetry and KV events: ``<engine>-<replica>``, or a remote's name."""
    engine: str
    replica: int
    model: str | None
    served_model_name: str
    url: str
    """Base URL the router sends requests to."""
    port: int
    telemetry_endpoint: str | None
    """Where its scheduler snapshots come; ``None`` for a stock vLLM engine (scraped)."""
    kv_events_endpoint: str | None
    """Where its KV events come; ``None`` for a stock engine that publishes none."""
    max_model_len: int | None
    max_num_seqs: int | None
    remote: bool
    api_key_env: str | None = None
    node: str | None = None
    kind: EngineKind = "hetserve"
    priority_wire: PriorityWire = "hetserve"
    """How the router sends it a request's ``priority`` (``_Engine.priority_wire``)."""


def decode_engine(raw: Any, index: int, base_dir: Path) -> EngineConfig:
    """Entry ``index`` of ``[[engines]]``, a local model path made absolute against
    ``base_dir``; keys named ``engines.<name>`` (``engines[<index>]`` before a valid name)."""
    name = raw.get("name") if isinstance(raw, dict) else None
    path = (f"engines.{name}" if isinstance(name, str) and NAME_PATTERN.match(name)
            else f"engines[{index}]")
    if not isinstance(raw, dict):
        return decode(LocalEngine, raw, path)
    table = {"served_model_name": name, **raw}
    if "url" in table:
        for k in table:
            if k not in RemoteEngine.__pydantic_fields__ and k in LocalEngine.__pydantic_fields__:
                raise SettingsError(f"{path}.{k}", "not allowed for a remote engine (one with "
                                    "`url`): its own host sets it")
        return decode(RemoteEngine, table, path)
    if "num_gpus" in table and "tensor_parallel_size" not in table:
        table["tensor_parallel_size"] = table["num_gpus"]
    e = decode(LocalEngine, table, path)
    assert e.model is not None
    return dataclasses.replace(e, model=_resolve_model(f"{path}.model", e.model, base_dir))


def _resolve_model(key: str, spec: str, base_dir: Path) -> str:
    """The model spec, with a local path made absolute; raise if it cannot exist."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_MODELS:
            raise SettingsError(key, f"unknown built-in model {spec!r}"
                                f"{suggest(name, BUILTIN_MODELS, BUILTIN_PREFIX)}; available: "
                                + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS))
        return spec
    path = base_dir / Path(spec).expanduser()
    if spec.startswith(("/", "./", "../", "~")) or spec in (".", "..") or path.exists():
        if not path.exists():
            raise SettingsError(key, f"local model path {spec!r} does not exist "
                                f"(looked for {os.path.normpath(path)})")
        return os.path.normpath(path)
    return spec
