"""One engine of a cluster file at a time, started through the launcher's Python API.

The trace builder runs the models of a cluster one after another (so two big models never
share the machine): :func:`engine_session` plans just that engine (``make_plan(...,
only=[name])``: the launcher's placement, ports, environment and ``engine_ext.serve``
command, no router), starts it under the launcher's ``Supervisor``, waits for
``/health`` and stops it on exit (its log is kept if anything failed). An engine with a
``url`` (run elsewhere) is used as is.

Seeded sampling on a CPU engine needs unchunked prefill (``unchunked``): vLLM 0.32 rewinds
a seeded request's random generator when a step discards its sampled token (a prompt whose
prefill is split over steps), and a CPU generator cannot be rewound, so the engine dies
(``RuntimeError: CPU Generator does not use offset``, seen on this project's machines).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from launcher.devices import detect_devices
from launcher.planner import make_plan
from launcher.settings import LaunchConfig, parse_launch_config
from launcher.supervisor import State, Supervisor
from router.config.addresses import http_url
from router.config.cluster import ConfigError, read_cluster_file
from router.config.engines import EngineConfig, LocalEngine, RemoteEngine

UNCHUNKED = "--no-enable-chunked-prefill"


@dataclass(frozen=True)
class EngineHandle:
    name: str
    served_model_name: str
    base_url: str


def describe_model(e: EngineConfig) -> dict[str, str]:
    """What a trace records about an engine's model and its serving settings (no path of
    this machine)."""
    out = {"name": e.served_model_name, "engine": e.name,
           "model": Path(e.model).name if e.model and not e.model.startswith("builtin:")
           else str(e.model or (e.url if isinstance(e, RemoteEngine) else None))}
    out.update({k: str(v) for k in ("dtype", "max_num_seqs", "max_model_len", "seed")
                if (v := getattr(e, k, None)) is not None})
    source = Path(e.model or "") / "hetserve-source.json"
    if e.model and source.is_file():
        meta = json.loads(source.read_text())
        out.update(description=meta["description"], license=meta["license"],
                   gguf_sha256=meta["gguf_sha256"], packages=" ".join(meta["packages"]))
    return out


def unchunked(cfg: LaunchConfig, name: str) -> LaunchConfig:
    """``cfg`` with local engine ``name`` prefilling every prompt in one step (vLLM's
    ``--no-enable-chunked-prefill``, ``max_num_batched_tokens`` at least ``max_model_len``),
    so that seeded sampling runs on CPU (module docstring)."""
    e = cfg.engine(name)
    if not isinstance(e, LocalEngine) or UNCHUNKED in e.extra_args:
        return cfg
    if e.max_model_len is None:
        raise SystemExit(f"engines.{name}: seeded sampling on CPU needs unchunked prefill, "
                         "which needs `max_model_len` set (the batch must hold one prompt)")
    new = dataclasses.replace(e, extra_args=[*e.extra_args, UNCHUNKED],
                              max_num_batched_tokens=max(e.max_num_batched_tokens or 0,
                                                         e.max_model_len))
    return dataclasses.replace(cfg, engines=[new if x.name == name else x
                                             for x in cfg.engines])


def single_engine_config(cluster: Path, engine: str) -> LaunchConfig:
    """Cluster file ``cluster`` with only engine ``engine`` (its table and ``[launcher]`` as
    written; the router's policies dropped): the other engines' models need not be on this
    machine, as ``trace build --models`` needs them (scripts that measure one engine).
    A file that does not validate (the engine's model not on this machine, say) is one line
    of error."""
    raw = read_cluster_file(cluster)
    engines = [e for e in raw.get("engines", []) if e.get("name") == engine]
    if not engines:
        raise SystemExit(f"--engine: no engine named {engine!r} in {cluster}")
    raw = {**raw, "engines": engines,
           "router": {k: v for k, v in raw.get("router", {}).items() if k != "policies"}}
    try:
        return parse_launch_config(raw, str(cluster), cluster.resolve().parent)
    except ConfigError as e:
        raise SystemExit(str(e)) from None


@contextlib.contextmanager
def engine_session(cfg: LaunchConfig, name: str, seeded: bool = False
                   ) -> Iterator[EngineHandle]:
    """Start engine ``name`` of ``cfg`` (unless remote), yield it healthy, stop it;
    ``seeded``: requests will sample with seeds (on a machine without GPUs the engine then
    prefills unchunked, ``unchunked``)."""
    devices = detect_devices()
    if seeded and not devices.gpus:
        cfg = unchunked(cfg, name)
    e = cfg.engine(name)
    if isinstance(e, RemoteEngine):
        yield EngineHandle(name, e.served_model_name, e.url.rstrip("/"))
        return
    if e.replicas != 1:
        raise ValueError(f"engines.{name}: the trace builder runs one replica per model "
                         f"(replicas = {e.replicas})")
    run_dir = Path(tempfile.mkdtemp(prefix=f"hetserve-trace-{name}-"))
    plan = make_plan(cfg, devices, run_dir, only=[name])
    (proc_plan,) = plan.engines
    la = cfg.launcher
    sup = Supervisor(run_dir, health_timeout_s=la.health_timeout_s, max_restarts=0,
                     backoff_s=la.restart_backoff_s, backoff_max_s=la.restart_backoff_max_s)
    t0 = time.monotonic()
    print(f"[trace] starting engine {name} ({proc_plan.devices}, port {proc_plan.port}); "
          f"log {proc_plan.spec.log_path}", file=sys.stderr, flush=True)
    proc = sup.start(proc_plan.spec)
    url = http_url(e.host, proc_plan.port)
    failed = True
    try:
        # Healthy means our process is up AND the port serves our model: another server
        # may take the port while a big model loads (then ours fails to bind and exits).
        while proc.state is not State.UP or not _serves(url, e.served_model_name):
            for ev in sup.step(restart=False):
                if ev.kind == "failed":
                    raise RuntimeError(f"engine {name} failed to start: {ev.detail}\n"
                                       f"{sup.tail(proc)}")
            if time.monotonic() - t0 > la.health_timeout_s:
                raise RuntimeError(f"engine {name}: {url} does not serve model "
                                   f"{e.served_model_name!r} after {la.health_timeout_s:g} s")
            time.sleep(0.5)
        print(f"[trace] engine {name} healthy after {time.monotonic() - t0:.0f} s",
              file=sys.stderr, flush=True)
        yield EngineHandle(name, e.served_model_name, url)
        failed = False
    finally:
        sup.stop_all(la.grace_period_s)
        if not failed:
            shutil.rmtree(run_dir, ignore_errors=True)  # keep the engine log only on failure


def _serves(url: str, model: str) -> bool:
    """Whether the OpenAI server at ``url`` lists ``model``."""
    try:
        r = httpx.get(f"{url}/v1/models", timeout=5.0)
        return r.status_code == 200 and model in {m["id"] for m in r.json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False
