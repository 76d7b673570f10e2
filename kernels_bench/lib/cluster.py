"""A benchmark's cluster, brought up and down through the launcher's Python API: the engine
profile's (``python -m kernels_bench profile``) and the lab's replays.

A replay's policy run needs a cluster config variant: the router's policy (and settings), and the
engines' scheduler. ``BenchCluster.prepare`` starts the engines of a variant (planned by
``launcher.planner.make_plan``, run by a ``launcher.supervisor.Supervisor``), keeping the
running ones when the variant's engines are the same as the last one's; the router is
started afresh for every run (its own supervisor and resolved config file), so each run
begins with empty router state (after one warm-up call per model). Before each run every
engine's prefix cache is emptied (``POST /reset_prefix_cache``: the replay starts local
engines with ``VLLM_SERVER_DEV_MODE=1``), so no run profits from the one before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from launcher.devices import detect_devices
from launcher.plan import Plan
from launcher.planner import make_plan
from launcher.settings import LaunchConfig
from launcher.supervisor import Managed, State, Supervisor
from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import HETSERVE_ONLY_KEYS, EngineConfig, EngineInstance
from scheduler_patches.program_admission import AdmissionSettings
from scheduler_patches.protected import RetentionSettings
from scheduler_patches.settings import from_table

STOCK_PREFIX = "vllm-"
"""``SCHED`` of a stock vLLM engine: ``vllm-fcfs``, ``vllm-priority``."""
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""Lets the replay reset an engine's prefix cache between runs (loopback endpoints)."""
_TICK_S = 0.5
_RESET_TRIES = 20


class ClusterError(RuntimeError):
    """A process of the cluster failed; the message holds the tail of its log."""


def engine_variant(cfg: ClusterConfig, sched: str | None,
                   settings: Sequence[tuple[str, Any]] = ()) -> list[EngineConfig]:
    """The engines of a run: every local engine with scheduler ``sched`` (if given; a
    stock vLLM server for ``vllm-fcfs`` and ``vllm-priority``, without the settings of
    hetserve's patch), the engine ``settings`` of the spec (retention keys, checked) and
    the prefix-cache reset endpoint on; remote engines as they are."""
    if settings:
        from_table(RetentionSettings, dict(settings))  # out of bounds: ValueError naming the key
        from_table(AdmissionSettings, dict(settings))
    out = []
    for e in cfg.engines:
        if e.remote:
            if sched is not None or settings:
                raise ClusterError(f"engines.{e.name} is remote: the replay cannot set its "
                                   f"scheduler or retention; run such policies without "
                                   ":SCHED or @settings on a cluster of local engines")
            out.append(e)
            continue
        e = dataclasses.replace(e, env={**e.env, **DEV_MODE_ENV}, **dict(settings))
        if sched is not None and sched.startswith(STOCK_PREFIX):
            e = dataclasses.replace(e, kind="vllm", sched_policy=sched.removeprefix(
                STOCK_PREFIX), **{k: None for k in HETSERVE_ONLY_KEYS})
        elif sched is not None:
            e = dataclasses.replace(e, sched_policy=sched)
        if e.admit_returning_first and e.sched_policy not in (None, "stjf"):
            raise ClusterError(f"engines.{e.name}: admit_returning_first reorders STJF's "
                               f"queue; its scheduler is {e.sched_policy}")
        out.append(e)
    return out


class BenchCluster:
    """Engines kept across runs, a fresh router per run."""

    def __init__(self, base: LaunchConfig, run_root: Path, log: Callable[[str], None]) -> None:
        self.base, self.run_root, self.log = base, run_root, log
        self.plan: Plan | None = None
        self.engines_sup: Supervisor | None = None
        self.engine_procs: list[Managed] = []
        self.router_sup: Supervisor | None = None
        self.router_proc: Managed | None = None
        self._engines: list[EngineConfig] | None = None
        self._runs = 0
        self._starts = 0
        self.http = httpx.Client(timeout=30.0)

    # ---- engines

    def prepare(self, engines: list[EngineConfig]) -> None:
        """Have exactly ``engines`` running (restarting them if they differ)."""
        if engines == self._engines and self._engines_alive():
            return
        self.stop_engines()
        cfg = dataclasses.replace(self.base, engines=engines)
        self._starts += 1
        run_dir = (self.run_root / f"engines-{self._starts}").absolute()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.plan = make_plan(cfg, detect_devices(), run_dir)
        la = cfg.launcher
        self.engines_sup = Supervisor(run_dir, health_timeout_s=la.health_timeout_s,
                                      max_restarts=0, backoff_s=la.restart_backoff_s,
                                      backoff_max_s=la.restart_backoff_max_s)
        for w in self.plan.warnings:
            self.log(f"warning: {w}")
        scheds = {i.name: (f"{STOCK_PREFIX}{e.sched_policy or 'fcfs'}" if e.kind == "vllm"
                           else e.sched_policy or "stjf")
                  for i in self.plan.config.instances() for e in [cfg.engine(i.engine)]}
        self.log(f"starting {len(self.plan.engines)} engine(s): "
                 + ", ".join(f"{p.spec.name} ({p.devices}, {scheds[p.spec.name]})"
                             for p in self.plan.engines) + f"; logs in {run_dir}")
        self.engine_procs = [self.engines_sup.start(p.spec) for p in self.plan.engines]
        self._wait_healthy(self.engines_sup, self.engine_procs, "engines")
        self._engines = engines
        self.warm_up()

    def instances(self) -> list[EngineInstance]:
        assert self.plan is not None
        return self.plan.config.instances()

    def warm_up(self) -> None:
        """One short call per engine, straight to it (first calls pay one-off costs)."""
        for inst in self.instances():
            r = self.http.post(f"{inst.url}/v1/completions", json={
                "model": inst.served_model_name, "prompt": "warm up", "max_tokens": 4,
                "ignore_eos": True})
            if r.status_code != 200:
                raise ClusterError(f"warm-up call to {inst.name} failed: HTTP "
                                   f"{r.status_code} {r.text[:300]}")

    def reset_prefix_caches(self) -> None:
        """Empty every engine's prefix cache (retrying while blocks are still held)."""
        for inst in self.instances():
            url = f"{inst.url}/reset_prefix_cache"
            for _ in range(_RESET_TRIES):
                r = self.http.post(url)
                if r.status_code == 404:
                    raise ClusterError(f"{inst.name} has no {url}: start it with "
                                       "VLLM_SERVER_DEV_MODE=1 so the replay can empty its "
                                       "prefix cache between runs")
                if r.status_code == 200 and r.json().get("success"):
                    break
                time.sleep(_TICK_S)
            else:
                raise ClusterError(f"{inst.name}: prefix cache reset kept failing "
                                   f"(HTTP {r.status_code} {r.text[:200]})")

    def _engines_alive(self) -> bool:
        if self.engines_sup is None:
            return False
        self._check(self.engines_sup)
        return all(m.state is State.UP for m in self.engine_procs)

    def check_engines(self) -> None:
        """ClusterError if an engine died (with its log's tail)."""
        if self.engines_sup is not None:
            self._check(self.engines_sup)

    def stop_engines(self) -> None:
        self.stop_router()
        if self.engines_sup is not None:
            self.engines_sup.stop_all(self.base.launcher.grace_period_s)
        self.engines_sup, self.engine_procs, self._engines = None, [], None

    # ---- router

    def start_router(self, router: RouterConfig, label: str) -> str:
        """Start a router with ``router``'s policy settings on the running engines; wait
        until it sees every engine up; return its base URL."""
        assert self.plan is not None and self.plan.router is not None
        self.stop_router()
        self._runs += 1
        resolved = self.plan.config
        router = dataclasses.replace(router, host=resolved.router.host,
                                     port=resolved.router.port, uds=None)
        cfg = dataclasses.replace(resolved, router=router)
        name = f"router-{self._runs:03d}"
        path = self.plan.run_dir / f"{name}.toml"
        path.write_text(f"# replay run {self._runs}: {label}\n" + cfg.to_toml())
        argv = list(self.plan.router.spec.argv)
        argv[argv.index("--config") + 1] = str(path)
        spec = dataclasses.replace(self.plan.router.spec, name=name, argv=argv,
                                   log_path=self.plan.run_dir / f"{name}.log")
        marker = self.plan.run_dir / name  # its own marker: stopping it spares the engines
        marker.mkdir(exist_ok=True)
        la = cfg.launcher
        self.router_sup = Supervisor(marker, health_timeout_s=la.health_timeout_s,
                                     max_restarts=0, backoff_s=la.restart_backoff_s,
                                     backoff_max_s=la.restart_backoff_max_s)
        self.router_proc = self.router_sup.start(spec)
        self._wait_healthy(self.router_sup, [self.router_proc], "the router")
        url = cfg.router_url()
        self._wait_engines_seen(url, len(self.instances()), la.health_timeout_s)
        self._warm_up_router(url)
        return url

    def _warm_up_router(self, url: str) -> None:
        """One short call per served model through the router, no workflow metadata
        (its first calls pay one-off costs; prompts under a KV block leave no cache)."""
        for model in dict.fromkeys(i.served_model_name for i in self.instances()):
            r = self.http.post(f"{url}/v1/chat/completions", json={
                "model": model, "messages": [{"role": "user", "content": "warm up"}],
                "max_tokens": 1})
            if r.status_code != 200:
                raise ClusterError(f"warm-up call through the router to {model} failed: "
                                   f"HTTP {r.status_code} {r.text[:300]}")

    def router_cpu_s(self) -> float:
        """CPU seconds the running router and its children (the predictor service's
        workers) have used: the router's share of the cores the engines compute on."""
        pid = self.router_proc.pid if self.router_proc is not None else None
        if pid is None:
            return 0.0
        total = 0.0
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
        except psutil.Error:
            pass
        return total

    def stop_router(self) -> None:
        if self.router_sup is not None:
            self.router_sup.stop_all(self.base.launcher.grace_period_s,
                                     first=[self.router_proc] if self.router_proc else [])
        self.router_sup, self.router_proc = None, None

    def _wait_engines_seen(self, url: str, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.http.get(f"{url}/health")
            if r.status_code == 200 and r.json().get("engines_up") == n:
                return
            time.sleep(_TICK_S)
        raise ClusterError(f"the router at {url} did not see all {n} engines up within "
                           f"{timeout_s:g} s: {r.text[:300]}")

    # ---- shared

    def _wait_healthy(self, sup: Supervisor, procs: Sequence[Managed], what: str) -> None:
        t0 = time.monotonic()
        while not all(m.state is State.UP for m in procs):
            self._check(sup)
            time.sleep(_TICK_S)
        self.log(f"{what} up after {time.monotonic() - t0:.0f} s")

    @staticmethod
    def _check(sup: Supervisor) -> None:
        for ev in sup.step(restart=False):
            if ev.kind == "failed":
                raise ClusterError(f"{ev.proc.spec.name} failed: {ev.detail}; last lines of "
                                   f"{ev.proc.spec.log_path}:\n{sup.tail(ev.proc)}")

    def close(self) -> None:
        """Stop everything this object started."""
        self.stop_engines()
        self.http.close()
