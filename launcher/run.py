"""Bring a planned cluster up, supervise it until asked to stop, bring it down.

Start-up: every engine at once, then (all healthy) the router; a failure on the way
prints the failing process and the tail of its log and stops everything. Supervision: an
engine that exits is marked down at the router (``POST /admin/engines/{id}/down``) and
restarted with exponential backoff up to ``launcher.max_restarts``; when it is healthy
again it is marked up. Ctrl-C or SIGTERM: graceful shutdown (``Supervisor.stop_all``); a
second one kills at once.

The backend (``launcher.backends``) decides where engines run: the router's file is
rewritten once they run (``Backend.placed``: on a Ray cluster their addresses are known
then) and whenever one moves (a port taken here, ``Backend.replan``; a re-placement on
another node); the router is told of the move (``POST /admin/engines/{id}/move``).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import httpx
import tomli_w
import zmq

from launcher.backends.base import Backend
from launcher.console import Console, table
from launcher.listener import share_port
from launcher.plan import BASE_ENV, Plan
from launcher.process import ProcessHandle
from launcher.scale import Scaler
from launcher.supervisor import Managed, State, Supervisor
from router.auth import load_keys
from router.config.addresses import LOOPBACK, http_url

DEMO_CLIENT = Path(__file__).resolve().parent.parent / "examples" / "demo_client.py"
_TICK_S = 0.5


class _StopRequest:
    """Signal handler: the first signal asks for a graceful stop, the next forces it."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.signum = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            self.sup.force = True
        self.signum = signum


def launch(plan: Plan, backend: Backend, console: Console, demo: bool = False) -> int:
    """Run the cluster of ``plan``, its engines on ``backend``; return the launcher's exit
    code."""
    la = plan.config.launcher
    plan, listener = share_port(plan)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    plan.write_resolved()
    (plan.run_dir / "plan.txt").write_text(plan.render() + "\n")
    console.log_path = plan.run_dir / "launcher.log"
    sup = Supervisor(plan.run_dir, health_timeout_s=la.health_timeout_s,
                     max_restarts=la.max_restarts, backoff_s=la.restart_backoff_s,
                     backoff_max_s=la.restart_backoff_max_s,
                     health_interval_s=la.health_interval_s,
                     unhealthy_after=la.unhealthy_after, restart_window_s=la.restart_window_s,
                     backend=backend)
    stop = _StopRequest(sup)
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    routers: list[Managed] = []
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        for w in plan.warnings:
            console.line(f"warning: {w}")
        console.line(f"starting {len(plan.engines)} engine(s); logs in {plan.run_dir}")
        engines = [sup.start(p.spec) for p in plan.engines]
        if not _wait_up(sup, engines, console, stop, "engines"):
            return 128 + stop.signum if stop.signum else 1
        unplaced = plan
        plan = backend.placed(plan, _handles(engines))
        plan.write_resolved()
        if plan.routers:
            routers = [sup.start(p.spec) for p in plan.routers]
            if not _wait_up(sup, routers, console, stop, "the router"):
                return 128 + stop.signum if stop.signum else 1
        console.raw(_summary(plan, engines, routers))
        client = None
        if demo:
            console.line("running the demo client")
            client = sup.spawn_plain([sys.executable, str(DEMO_CLIENT), "--base-url",
                                      plan.config.router_url() + "/v1"], dict(BASE_ENV))
            helpers.append(client)
        return _supervise(sup, backend, plan, unplaced, routers, console, stop, client)
    finally:
        console.done()
        console.line("stopping the cluster")
        if listener is not None:
            listener.close()  # the workers' copies serve until they stop
        sup.stop_all(la.grace_period_s, first=routers, helpers=helpers)
        for s, handler in previous.items():
            signal.signal(s, handler)
        console.line("stopped")


def _wait_up(sup: Supervisor, procs: list[Managed], console: Console, stop: _StopRequest,
             what: str) -> bool:
    """Wait until all of ``procs`` are healthy; False on a failure or a stop request."""
    t0 = time.monotonic()
    while not stop.signum:
        for ev in sup.step(restart=False):
            name = ev.proc.spec.name
            if ev.kind == "up":
                console.line(f"{name} is up ({ev.detail})")
            elif ev.kind == "failed":
                console.done()
                console.line(f"{name} failed to start: {ev.detail}; last lines of "
                             f"{ev.proc.spec.log_path}:")
                console.raw(textwrap.indent(sup.tail(ev.proc), "    "))
                return False
        if all(m.state is State.UP for m in procs):
            console.done()
            return True
        waiting = ", ".join(m.spec.name for m in procs if m.state is not State.UP)
        console.status(f"waiting for {what}: {waiting} ({time.monotonic() - t0:.0f} s)")
        time.sleep(_TICK_S)
    return False


def _handles(engines: list[Managed]) -> dict[str, ProcessHandle]:
    """Each running engine's handle, by name."""
    return {m.spec.name: m.handle for m in engines if m.handle is not None}


def _supervise(sup: Supervisor, backend: Backend, plan: Plan, unplaced: Plan,
               routers: list[Managed], console: Console, stop: _StopRequest,
               client: subprocess.Popen[bytes] | None) -> int:
    """Restart what dies until a stop request (exit 0), a router process gives up (1), or
    the demo ``client`` ends (its exit code). ``unplaced``: the plan before the backend
    placed its engines (``plan`` then), to move one and to scale (``launcher.scale``)."""
    router_url = plan.config.router_url() if routers else None
    r = plan.config.router
    admin_key = min(load_keys(r.admin_keys_file, r.admin_keys_env, "router admin keys"),
                    default=None)
    current = [plan]
    base = [unplaced]

    def placed() -> None:
        """Rewrite the router's file from where the engines run now."""
        if scaler is not None:
            base[0] = scaler.plan
        current[0] = backend.placed(base[0], _handles([m for m in sup.procs
                                                       if m not in routers]))
        current[0].write_resolved()

    def before_restart(m: Managed) -> str | None:
        """An engine the backend moves before its restart gets its new spec; the
        resolved file is rewritten, so a restarted router reads it too."""
        change = backend.replan(base[0], m.spec.name)
        if change is None:
            return None
        base[0], moved = change
        m.spec = next(p.spec for p in base[0].engines if p.spec.name == m.spec.name)
        placed()
        return moved

    def admin(name: str, action: str, params: dict[str, str] | None = None,
              body: Any = None) -> int:
        if router_url is None:
            return 0
        return _admin(console, router_url, name, action, admin_key, params, body)

    scaler = None
    if backend.scales and router_url is not None:
        try:
            scaler = Scaler(unplaced, sup, console, admin,
                            lambda name: _inflight(router_url, name), r.request_timeout_s,
                            plan.config.launcher.grace_period_s, lambda plan: placed())
        except zmq.ZMQError as e:
            console.line(f"warning: --scale is not available ({e}: {plan.run_dir} too deep "
                         "for an ipc:// socket?); the engines keep being supervised")
    sup.before_restart = before_restart
    try:
        while not stop.signum:
            for ev in sup.step(restart=True):
                name = ev.proc.spec.name
                if ev.proc in routers:
                    console.line(f"{name} {'is up again' if ev.kind == 'up' else ev.detail}")
                    if ev.kind == "failed":
                        return 1
                    if ev.kind == "up":  # a restarted router takes engines it has not
                        for m in not_serving(sup, routers, scaler):  # heard from as up
                            admin(m.spec.name, "down")
                    continue
                if ev.kind == "moved":
                    console.line(f"{name} {ev.detail}")
                    placed()
                    inst = next((i for i in current[0].config.instances() if i.name == name),
                                None)
                    if inst is not None:  # not before it joined routing
                        admin(name, "move", {"url": inst.url} | (
                            {"node": inst.node} if inst.node else {}))
                    continue
                if scaler is not None and name in scaler.joining:
                    if ev.kind == "up":
                        console.line(f"{name} is up")
                        scaler.joined(ev.proc)
                        continue
                    if ev.kind == "failed":  # never joined: scaling may go on
                        del scaler.joining[name]
                if ev.kind == "up":
                    console.line(f"{name} is up again (restart {ev.proc.restarts})")
                else:
                    console.line(f"{name} {ev.detail}" + ("; the other engines keep serving"
                                                          if ev.kind == "failed" else ""))
                if scaler is None or not scaler.busy(name):
                    admin(name, "up" if ev.kind == "up" else "down")
            if scaler is not None:
                scaler.step()
            if client is not None and client.poll() is not None:
                return client.returncode
            time.sleep(_TICK_S)
        return 0
    finally:
        if scaler is not None:
            scaler.close()


def not_serving(sup: Supervisor, routers: list[Managed], scaler: Scaler | None
                ) -> list[Managed]:
    """The engines in routing that are not up (restarting, or given up on): what a router
    that has just restarted must be told are down."""
    return [m for m in sup.procs if m not in routers
            and not (scaler is not None and scaler.busy(m.spec.name))
            and m.state in (State.STARTING, State.DOWN, State.FAILED)]


def _admin(console: Console, router_url: str, instance: str, action: str,
           admin_key: str | None, params: dict[str, str] | None = None,
           body: Any = None) -> int:
    """Tell the router an engine is down, up, moved, added or removed; its HTTP status
    (0: no answer). Best effort for marks: the router also sees telemetry, and a
    restarted router reads the resolved file."""
    url = f"{router_url}/admin/engines/{instance}/{action}"
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        r = httpx.post(url, timeout=10.0, headers=headers, params=params, json=body)
    except httpx.HTTPError as e:
        console.log(f"POST {url} failed: {e!r}")
        return 0
    console.log(f"POST {url}: {r.status_code} {r.text[:300]}")
    return r.status_code


def _inflight(router_url: str, instance: str) -> int | None:
    """Requests the router has open on ``instance`` (0 if it does not route to it; None
    if it does not answer)."""
    try:
        body = httpx.get(f"{router_url}/health", timeout=5.0).json()
        return next((int(e["inflight"]) for e in body["instances"] if e["name"] == instance),
                    0)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _summary(plan: Plan, engines: list[Managed], routers: list[Managed]) -> str:
    insts = {i.name: i for i in plan.config.instances()}
    rows: list[list[object]] = [
        [p.spec.name, insts[p.spec.name].kind, p.model, p.devices,
         m.handle.where if m.handle is not None else "-",
         urlsplit(insts[p.spec.name].url).port, m.pid, m.state.value]
        for p, m in zip(plan.engines, engines)]
    rows += [[i.name, i.kind, i.served_model_name, "remote", i.node or "-", i.url, "-",
              "remote"] for i in plan.remote]
    lines = [table(["ENGINE", "KIND", "MODEL", "DEVICES", "NODE", "PORT", "PID", "STATE"],
                   rows), ""]
    if routers:
        r = plan.config.router
        uds = f", unix socket {r.uds}" if r.uds else ""
        pids = ", ".join(str(m.pid) for m in routers)
        workers = (f", {r.workers} workers on ports {', '.join(map(str, r.worker_ports or []))}"
                   if r.workers > 1 else "")
        lines.append(f"router  {plan.config.router_url()}/v1  (policy {r.policy}, "
                     f"pid {pids}{workers}{uds})")
    else:
        lines.append("router  not started (--only); on the router's host add to its "
                     "cluster file:\n" + _remote_entries(plan))
    lines.append(f"logs    {plan.run_dir}")
    return "\n".join(lines)


def _remote_entries(plan: Plan) -> str:
    """``[[engines]]`` entries that point a router on another host at these engines."""
    entries = []
    for inst in plan.config.instances():
        e = plan.config.engine(inst.engine)
        host = socket.gethostname() if e.host in ("0.0.0.0", "::") else e.host
        entry = {"name": inst.name, "url": http_url(host, inst.port),
                 "served_model_name": inst.served_model_name, "model": inst.model,
                 "telemetry_endpoint": inst.telemetry_endpoint,
                 "kv_events_endpoint": inst.kv_events_endpoint,
                 "max_model_len": inst.max_model_len, "max_num_seqs": inst.max_num_seqs,
                 **({"kind": e.kind, "sched_policy": e.sched_policy or "fcfs"}
                    if e.kind == "vllm" else {})}
        entries.append({k: v for k, v in entry.items() if v is not None})
    text = tomli_w.dumps({"engines": entries})
    if any(plan.config.engine(i.engine).host == LOOPBACK for i in plan.config.instances()) \
            or "ipc://" in text:
        text += ("# note: 127.0.0.1 and ipc:// are reachable from this machine only; set "
                 "host and tcp:// endpoints\n# in this host's file to serve another one\n")
    return text
