"""The cluster file as the router reads it: ``[router]``, ``[[engines]]``, the rules
across them, the loader, engines joining and leaving at run time (``with_engine``).

Paths are relative to the file's folder. Ports and endpoints left out are assigned by the
launcher, which writes a *resolved* file (``to_toml``): ``instances()`` needs it. Every
default address is loopback or ``ipc://``. A bad file raises ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any

import tomli_w
from pydantic import Field
from pydantic.dataclasses import dataclass

from engine_ext.telemetry import is_loopback_endpoint, publisher_binds, subscriber_binds
from router.config.addresses import (LOOPBACK, http_url, is_loopback, loopback_tcp_port,
                                     loopback_url_port)
from router.config.engines import (ENDPOINT_KEYS, EngineConfig, EngineInstance, RemoteEngine,
                                   decode_engine)
from router.policies.registry import validate_settings
from router.settings import (MAX_WORKERS, STRICT, Port, Positive, PositiveInt, SettingsError,
                             Verified, check, decode, encode)


class ConfigError(ValueError):
    """An invalid cluster file; ``str()`` is ``<file>: <key path>: <what is wrong>``."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


@dataclass(frozen=True, config=STRICT)
class RouterConfig(Verified):
    """``[router]``: the router process."""

    policy: str
    """Routing policy name (``router.policies``' registry), e.g. ``chimera``."""
    host: str = LOOPBACK
    port: Port | None = None
    """TCP port; assigned by the launcher when left out."""
    uds: str | None = None
    """Also listen on this unix socket path."""
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    """Router processes serving ``port`` together (``SO_REUSEPORT``), sharing the program
    table and engine marks (``router.dispatch.peers``); by hand, ``python -m router
    --worker I`` for I in 0..workers-1."""
    worker_ports: list[Port] | None = None
    """Each worker's own port (``/health``, ``/metrics``, admin); assigned by the launcher."""
    sync_dir: str | None = None
    """Directory of the workers' ipc sockets; the launcher sets its run directory."""
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The raw ``[router.policies.<name>]`` tables, validated by ``router.policies``."""
    predictors: dict[str, str] = field(default_factory=dict)
    """Predictor artifact paths by predictor name."""
    heartbeat_timeout_s: Positive = 1.5
    """An engine with no telemetry for this long is down: three heartbeats
    (``engine_ext.telemetry.DEFAULT_HEARTBEAT_S``), within 2 s (docs/reliability.md)."""
    sole_engine_timeout_s: Positive = 5.0
    """The heartbeat timeout (the larger applies) of an engine no live engine of its model
    could replace; on 2 cores such an engine went silent 1.5-2.0 s (docs/reliability.md)."""
    scheduler_stall_timeout_s: Positive = 30.0
    """An engine whose telemetry shows one scheduler step this long with work is down until
    the step moves (``router.state.engines``)."""
    allow_client_priority: bool = False
    """Whether a client may set the engine priority itself."""
    telemetry_interval_ms: Positive = 20.0
    """Engines' minimum time between two scheduler snapshots while busy."""
    scrape_interval_ms: Annotated[float, Field(ge=10, le=60_000)] = 100.0
    """How often the router reads a stock engine's ``/metrics`` (``router.dispatch.scraper``)."""
    scrape_timeout_s: Positive = 10.0
    """A stock engine with no good scrape this long is down; also one scrape's limit (vLLM's
    ``/metrics`` was measured silent 3.5 and 12.7 s on 2 busy cores)."""
    request_timeout_s: Positive = 600.0
    """Longest silence from an engine on any request (a non-streamed one sends nothing
    until its generation ends)."""
    stream_first_byte_timeout_s: Positive = 300.0
    """Longest wait for a stream's first event (queueing and prefill included); then an
    error event, and the engine is down until its health probe answers."""
    stream_stall_timeout_s: Positive = 60.0
    """Longest silence between two events of a started stream; then as for the first byte."""
    breaker_backoff_s: Positive = 1.0
    """An engine a failed call marked down is probed (``GET /health``) after this long,
    doubling per trip (``router.dispatch.health_probe.backoff``)."""
    breaker_backoff_max_s: Positive = 30.0
    """The longest such backoff."""
    max_inflight: PositiveInt = 4096
    """Generation requests handled at once; one more is answered 503 with ``retry-after``."""
    program_ttl_s: Positive = 600.0
    """A program with no request this long leaves the program table (and its conversations
    and stored responses ``router.state.conversations``)."""
    program_affinity: bool = True
    """A program's call goes to its last call's engine unless ``affinity_*_threshold`` find
    it overloaded (policies with ``Policy.program_affinity``)."""
    affinity_abs_threshold: Annotated[int, Field(ge=0)] = 64
    """The program leaves an engine whose requests exceed the least loaded's by more than
    this *and* ``affinity_rel_threshold`` times: SGLang's cache-aware rule and defaults
    (``balance_abs_threshold``; ``router.policies.affinity.overloaded``)."""
    affinity_rel_threshold: Annotated[float, Field(ge=1.0)] = 1.5
    """Guardrail's relative part (SGLang's ``balance_rel_threshold``)."""
    max_programs: PositiveInt = 65_536
    """Programs kept, and as many conversations and stored response ids (least recently
    used leave first; ``router.state.conversations``)."""
    find_conversations: bool = True
    """Join a call that names no program to the program whose conversation it extends."""
    api_keys_file: str | None = None
    """API keys of the OpenAI endpoints, one per line (``router.auth``); none: open."""
    api_keys_env: str | None = None
    """An environment variable holding API keys, comma-separated."""
    admin_keys_file: str | None = None
    """Keys of the admin endpoints; none: loopback and unix-socket callers only."""
    admin_keys_env: str | None = None
    trusted_keys_file: str | None = None
    """API keys (trusted keys are API keys too) whose callers' workflow position and, with
    ``allow_client_priority``, priority are used; other calls are ranked on predictions
    (``router.admission.workflow.RANKING_FIELDS``). No key configured: all are trusted."""
    trusted_keys_env: str | None = None
    """An environment variable holding trusted API keys, comma-separated."""
    telemetry_keys_dir: str | None = None
    """CURVE keys of the telemetry plane (``engine_ext.curve``); required for a telemetry
    endpoint beyond loopback."""
    insecure: bool = False
    """Allow a listener beyond loopback without API keys, and telemetry beyond loopback
    without ``telemetry_keys_dir`` (cleartext)."""

    def verify(self) -> None:
        """A named policy; API keys for a listener beyond loopback; several workers: one
        port each, no unix socket, no per-process plans (vinelm)."""
        check("policy", bool(self.policy.strip()), "must not be empty")
        check("host", is_loopback(self.host) or self.insecure or any((
            self.api_keys_file, self.api_keys_env, self.trusted_keys_file,
            self.trusted_keys_env)), f"{self.host!r} listens beyond loopback without API "
              "keys: set api_keys_file or api_keys_env, or insecure = true")
        if self.worker_ports is not None:
            check("worker_ports", len(self.worker_ports) == self.workers,
                  f"gives {len(self.worker_ports)} ports for {self.workers} workers")
        if self.workers > 1:
            check("uds", not self.uds, "a unix socket is served by one process; leave it "
                  "out with workers > 1")
            check("workers", self.policy != "vinelm", "vinelm keeps each program's plan in "
                  "its router process; run one worker")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster file, as the router reads it."""

    source: str
    """The file it was loaded from (names it in errors)."""
    router: RouterConfig
    engines: list[EngineConfig]

    def engine(self, name: str) -> EngineConfig:
        return {e.name: e for e in self.engines}[name]

    def instances(self) -> list[EngineInstance]:
        """One ``EngineInstance`` per replica; needs every port and endpoint set (a stock
        vLLM engine has no telemetry endpoint, and a remote one may have no KV events)."""
        out = []
        for e in self.engines:
            ports = e.ports
            tele, kv = (e.per_replica(k) for k in ENDPOINT_KEYS)
            for k, values in zip(("port", *ENDPOINT_KEYS), (ports, tele, kv)):
                if values is None and (k == "port" or e.kind != "vllm"):
                    raise ConfigError(self.source, f"engines.{e.name}.{k}", "not set; the "
                                      "launcher assigns it (run the cluster with `python -m "
                                      "launcher`)")
            assert ports is not None
            for i in range(e.replicas):
                out.append(EngineInstance(
                    name=e.name if e.remote else f"{e.name}-{i}", engine=e.name, replica=i,
                    model=e.model, served_model_name=e.served_model_name,
                    url=(e.url.rstrip("/") if isinstance(e, RemoteEngine)
                         else http_url(e.host, ports[i])),
                    port=ports[i], telemetry_endpoint=tele[i] if tele else None,
                    kv_events_endpoint=kv[i] if kv else None,
                    max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs,
                    remote=e.remote, api_key_env=e.api_key_env, node=e.node, kind=e.kind,
                    priority_wire=e.priority_wire))
        return out

    def claimed_ports(self) -> set[int]:
        """Ports of this machine the file gives (listeners and loopback TCP endpoints)."""
        return set(self._port_owners())

    def router_url(self) -> str:
        if self.router.port is None:
            raise ConfigError(self.source, "router.port", "not set; the launcher assigns it")
        return http_url(self.router.host, self.router.port)

    def to_dict(self) -> dict[str, Any]:
        """The file's tables, with the values that differ from the defaults."""
        return {"router": encode(self.router), "engines": [encode(e) for e in self.engines]}

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def verify(self) -> None:
        """The rules across tables (SettingsError naming the key): ``verify_engines``, and
        every policy table valid for ``router.policies``' registry."""
        self.verify_engines()
        validate = _policy_validator()
        if validate is None:
            return
        for name, table in {self.router.policy: {}, **self.router.policies}.items():
            try:
                validate(name, table)
            except SettingsError as e:
                named = e.key == f"router.policies.{name}" and name not in self.router.policies
                raise SettingsError("router.policy" if named else e.key, e.problem) from None

    def verify_engines(self) -> None:
        """The rules of the engine set (also as it changes at run time): no stock KV events
        to a router requiring keys, endpoints the workers can share, distinct names, one
        model per served name, no port or endpoint given twice, ``_verify_endpoints``."""
        r = self.router
        for e in self.engines:
            check(f"engines.{e.name}.kv_events_endpoint", not (
                r.telemetry_keys_dir and e.kind == "vllm" and e.kv_events_endpoint),
                  "stock vLLM publishes KV events without CURVE keys, which this router "
                  "(telemetry_keys_dir) refuses: leave it out (the engine is routed to "
                  "without prefix matching)")
        if r.workers > 1:
            for e in self.engines:
                for k, _, ep in e.endpoints():
                    check(f"engines.{e.name}.{k}", not subscriber_binds(ep),
                          f"{ep!r} is bound by the router, which {r.workers} workers cannot "
                          "share: use ipc://, or tcp://*:PORT bound by the engine")
        self._verify_names()
        self._port_owners()
        self._verify_endpoints()

    def _verify_names(self) -> None:
        seen: set[str] = set()
        models: dict[str, EngineConfig] = {}
        for i, e in enumerate(self.engines):
            check(f"engines[{i}].name", e.name not in seen,
                  f"{e.name!r} is already the name of another engine")
            seen.add(e.name)
            other = models.setdefault(e.served_model_name, e)
            check(f"engines.{e.name}.served_model_name", other is e
                  or None in (other.model, e.model) or other.model == e.model,
                  f"{e.served_model_name!r} is also served by engines.{other.name} with "
                  f"another model ({other.model!r} vs {e.model!r})")

    def _port_owners(self) -> dict[int, str]:
        """The given ports of this machine with the key of each; raise if two share one."""
        owners: dict[int, str] = {}

        def claim(port: int, key: str) -> None:
            check(key, port not in owners, f"port clash: {port} is also used by "
                  f"{owners.get(port)}")
            owners[port] = key

        if self.router.port is not None:
            claim(self.router.port, "router.port")
        for i, port in enumerate(self.router.worker_ports or []):
            claim(port, f"router.worker_ports[{i}]")
        endpoints: set[str] = set()
        for e in self.engines:
            key = f"engines.{e.name}"
            if isinstance(e, RemoteEngine):
                if port := loopback_url_port(e.url):
                    claim(port, f"{key}.url")
            else:
                for i, port in enumerate(e.ports or []):
                    claim(port, f"{key}.port" + (f" (replica {i})" if e.replicas > 1 else ""))
            for k, _, ep in e.endpoints():
                tcp_port = loopback_tcp_port(ep)
                if tcp_port is not None and ep not in endpoints:
                    endpoints.add(ep)
                    claim(tcp_port, f"{key}.{k}")
        return owners

    def _verify_endpoints(self) -> None:
        """An endpoint an engine binds belongs to one engine and one stream; one the
        router binds (tcp to a host) may be shared by engines of one stream only. One
        beyond loopback needs CURVE keys (``telemetry_keys_dir``) unless ``insecure``."""
        streams: dict[str, tuple[str, str]] = {}
        r = self.router
        for e in self.engines:
            for k, owner, ep in e.endpoints():
                check(owner, is_loopback_endpoint(ep) or bool(r.telemetry_keys_dir)
                      or r.insecure, f"{ep!r} is beyond loopback: anyone who reaches it "
                      "could read or inject telemetry; set [router] telemetry_keys_dir "
                      "(keys from python -m engine_ext.curve DIR), or insecure = true")
                if ep in streams:
                    prev_owner, prev_kind = streams[ep]
                    check(owner, not publisher_binds(ep) and prev_kind == k,
                          f"endpoint clash: {ep!r} is also {prev_owner}")
                streams.setdefault(ep, (owner, k))


@dataclass(frozen=True, config=STRICT)
class _File:
    """The file's top level: its tables, each decoded on its own (``launcher`` and
    ``cluster`` by ``launcher.settings``)."""

    router: dict[str, Any]
    engines: Annotated[list[Any], Field(min_length=1)]
    launcher: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)


def read_cluster_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tables of the TOML file ``path`` (ConfigError if it cannot be read)."""
    source = str(path)
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(source, "(file)", f"cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "(syntax)", str(e)) from None
    except (RecursionError, MemoryError, ValueError) as e:  # ValueError: an int too long
        raise ConfigError(source, "(syntax)", f"nested too deeply or too large "
                          f"({type(e).__name__}: {str(e)[:100]})") from None


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster file; raise ``ConfigError`` naming file and key."""
    return parse_cluster_config(read_cluster_file(path), str(path),
                                Path(path).resolve().parent)


def parse_cluster_config(data: dict[str, Any], source: str, base_dir: Path) -> ClusterConfig:
    """Validate the tables of a cluster file read from ``source`` (paths relative to
    ``base_dir``)."""
    try:
        cfg = ClusterConfig(source, *decode_tables(data, base_dir))
        cfg.verify()
    except SettingsError as e:
        raise ConfigError(source, e.key, e.problem) from None
    return cfg


_PATH_KEYS = ("uds", "sync_dir", "api_keys_file", "admin_keys_file", "trusted_keys_file",
              "telemetry_keys_dir")
"""The keys of ``[router]`` that name files, relative to the cluster file."""


def decode_tables(data: dict[str, Any],
                  base_dir: Path) -> tuple[RouterConfig, list[EngineConfig]]:
    """``[router]`` and ``[[engines]]`` of ``data``, each valid on its own, paths (a policy's
    non-empty ``*_path`` strings too) made absolute against ``base_dir`` (SettingsError)."""
    top = decode(_File, data, "")
    router = decode(RouterConfig, top.router, "router")
    engines = [decode_engine(raw, i, base_dir) for i, raw in enumerate(top.engines)]
    router = dataclasses.replace(
        router, **{k: absolute(getattr(router, k), base_dir) for k in _PATH_KEYS},
        predictors={k: absolute(v, base_dir) for k, v in router.predictors.items()},
        policies={name: {k: absolute(v, base_dir) if k.endswith("_path") and
                         isinstance(v, str) and v else v for k, v in table.items()}
                  for name, table in router.policies.items()})
    return router, engines


def absolute(path: str | None, base_dir: Path) -> str | None:
    """``path`` of the file (``~`` expanded) made absolute against ``base_dir``."""
    if path is None:
        return None
    return os.path.normpath(base_dir / Path(path).expanduser())


def _policy_validator() -> Callable[[str, Mapping[str, Any]], Any] | None:
    """The policy registry's validator (a hook: tests of the file alone set it to None)."""
    return validate_settings


def with_engine(cfg: ClusterConfig, table: Mapping[str, Any],
                served: Collection[str] | None = None,
                models: Mapping[str, str] | None = None) -> ClusterConfig:
    """``cfg`` with one more engine entry (``POST /admin/engines/{name}/add``), checked as
    in a file (ConfigError): one with a ``url``, a new name, a model served (``served``,
    default ``cfg``'s) and started with the model first served under its name (``models``,
    default ``cfg``'s): the policy was built for those (another needs a router restart)."""
    source = f"{cfg.source} (added engine)"
    try:
        e = decode_engine(dict(table), len(cfg.engines), Path(cfg.source).parent)
        key = f"engines.{e.name}"
        check(f"{key}.url", e.remote, "an added engine needs its url")
        check(f"{key}.name", e.name not in {i.name for i in cfg.instances()},
              f"{e.name!r} is already an engine instance")
        check(f"{key}.served_model_name",
              e.served_model_name in (served if served is not None
                                      else {x.served_model_name for x in cfg.engines}),
              f"{e.served_model_name!r} is not served here; a new model needs a restart of "
              "the router")
        first = (models if models is not None
                 else {x.served_model_name: x.model for x in cfg.engines}).get(e.served_model_name)
        check(f"{key}.model", first is None or e.model == first,
              f"{e.served_model_name!r} is served by {first!r} here, not {e.model!r}; "
              "another model needs a restart of the router")
        new = dataclasses.replace(cfg, engines=[*cfg.engines, e])
        new.verify_engines()
    except SettingsError as err:
        raise ConfigError(source, err.key, err.problem) from None
    return new


def without_engine(cfg: ClusterConfig, name: str, last: bool = False) -> ClusterConfig:
    """``cfg`` without the engine entry ``name``, one with a ``url``, not the last of its
    model unless ``last`` (another router worker's removal, ordered after the calls it won
    over: applied as is) (ConfigError)."""
    e = next((x for x in cfg.engines if x.name == name), None)
    if e is None or not e.remote:
        raise ConfigError(cfg.source, f"engines.{name}", "no engine entry of that name with a "
                          "url (only engines the launcher placed or added can be removed)")
    if not last and sum(x.replicas for x in cfg.engines
                        if x.served_model_name == e.served_model_name) == 1:
        raise ConfigError(cfg.source, f"engines.{name}", f"the last engine of model "
                          f"{e.served_model_name!r}")
    return dataclasses.replace(cfg, engines=[x for x in cfg.engines if x is not e])
