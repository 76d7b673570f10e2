"""Changing a model's replica count on a running Ray cluster (``--scale NAME=N``).

``python -m launcher FILE --scale NAME=N`` asks the running launcher over its control
socket (``ipc://<run dir>/launcher.ctl``, ZeroMQ REQ/REP, one msgspec message each way)
and prints its answer. The running launcher (``Scaler``, driven by its supervision loop):

- up: places the new replicas (their placement groups, as at start-up); each joins
  routing once healthy (``POST /admin/engines/{id}/add``) and the router's file is
  rewritten;
- down: the last replicas are marked down at the router (no new request goes there),
  each is stopped once the router has no request open on it (``/health`` ``inflight``)
  or the drain timeout passes, then removed (``.../remove``) and the file rewritten:
  no request is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
import zmq

from launcher import LaunchError
from launcher.console import Console
from launcher.backends.ray import RayProcess, with_replicas
from launcher.plan import Plan, placed_entry
from launcher.supervisor import Managed, State, Supervisor
from router.config.engines import MAX_REPLICAS

CONTROL_NAME = "launcher.ctl"
REPLY_TIMEOUT_S = 600.0
"""How long ``--scale`` waits for the launcher's answer (placing replicas takes a while
when the cluster must first find room)."""


class ScaleRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    engine: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    replicas: Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS)]


class ScaleReply(msgspec.Struct, frozen=True):
    ok: bool
    message: Annotated[str, msgspec.Meta(max_length=4096)]


def control_endpoint(run_dir: Path) -> str:
    return f"ipc://{run_dir / CONTROL_NAME}"


def ask_to_scale(run_dir: Path, engine: str, replicas: int,
                 timeout_s: float = REPLY_TIMEOUT_S) -> ScaleReply:
    """Ask the launcher running in ``run_dir`` (LaunchError: none answers)."""
    if not (run_dir / CONTROL_NAME).exists():
        raise LaunchError(f"no launcher is running in {run_dir} (no {CONTROL_NAME}); give "
                          "--run-dir of the running cluster (its launcher printed it: logs ...)")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # a send waits for a live launcher ...
    sock.setsockopt(zmq.SNDTIMEO, 3000)  # ... this long (the socket file may be stale)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.MAXMSGSIZE, 65536)
    try:
        sock.connect(control_endpoint(run_dir))
        try:
            sock.send(msgspec.msgpack.encode(ScaleRequest(engine, replicas)))
        except zmq.Again:
            raise LaunchError(f"no launcher is running in {run_dir} (nothing listens on "
                              f"{CONTROL_NAME})") from None
        return msgspec.msgpack.decode(sock.recv(), type=ScaleReply)
    except zmq.Again:
        raise LaunchError(f"the launcher in {run_dir} did not answer within "
                          f"{timeout_s:g} s") from None
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as e:
        raise LaunchError(f"the launcher in {run_dir} answered garbage: {e}") from None
    finally:
        sock.close()
        ctx.term()


@dataclass
class _Drain:
    proc: Managed
    deadline: float


class Scaler:
    """The running launcher's side: answers ``--scale`` and carries the change out."""

    def __init__(self, plan: Plan, sup: Supervisor, console: Console,
                 admin: Callable[[str, str, dict[str, str] | None, Any], int],
                 inflight: Callable[[str], int | None], drain_timeout_s: float,
                 grace_s: float, on_change: Callable[[Plan], None]) -> None:
        """``plan``: before placement; ``admin(instance, action, params, json)``: a
        router admin call (its status, 0 if it failed); ``inflight(instance)``: requests
        the router has open on it (None if unknown); ``on_change``: the plan changed
        (rewrite the router's file)."""
        self.plan, self.sup, self.console = plan, sup, console
        self.admin, self.inflight = admin, inflight
        self.drain_timeout_s, self.grace_s = drain_timeout_s, grace_s
        self.on_change = on_change
        self.joining: dict[str, Managed] = {}
        self.draining: dict[str, _Drain] = {}
        self.target: dict[str, int] = {}
        """Replicas each scaled entry goes to, once its drains end."""
        ctx = zmq.Context.instance()
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 65536)
        self._sock.bind(control_endpoint(plan.run_dir))

    def close(self) -> None:
        self._sock.close()

    def busy(self, name: str) -> bool:
        """``name`` is joining or draining: its up/down marks are the scaler's."""
        return name in self.joining or name in self.draining

    def step(self) -> None:
        """Answer a waiting request, and move drains along."""
        try:
            raw = self._sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            raw = None
        if raw is not None:
            try:
                message, ok = self._request(msgspec.msgpack.decode(raw, type=ScaleRequest)), True
            except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as e:
                message, ok = f"malformed request: {e}", False
            except LaunchError as e:
                message, ok = str(e), False
            self.console.line(f"scale: {message}")
            self._sock.send(msgspec.msgpack.encode(ScaleReply(ok, message[:4096])))
        self._drains()

    def joined(self, m: Managed) -> None:
        """A replica being added is healthy: it joins routing."""
        name = m.spec.name
        if self.joining.pop(name, None) is None or not isinstance(m.handle, RayProcess):
            return
        e = self.plan.config.engine(name.rsplit("-", 1)[0])
        entry = placed_entry(e, name, m.spec.placement.telemetry_endpoint,
                             m.spec.placement.kv_events_endpoint, m.handle.url, m.handle.where)
        status = self.admin(name, "add", None, entry)
        self.console.line(f"{name} joined routing" if status == 200 else
                          f"{name} is up but the router refused it (HTTP {status})")
        self.on_change(self.plan)

    def _request(self, req: ScaleRequest) -> str:
        if self.joining or self.draining:
            raise LaunchError("a scaling is still in progress ("
                              + ", ".join([*self.joining, *self.draining]) + "); try later")
        plan = self.plan
        current = next((e.replicas for e in plan.config.engines if e.name == req.engine
                        and not e.remote), None)
        held = {m.handle.port for m in self.sup.procs if isinstance(m.handle, RayProcess)
                and m.handle.address == plan.telemetry_host}
        # LaunchError: no such entry
        bigger = with_replicas(plan, req.engine, req.replicas, held=held)
        assert current is not None
        if req.replicas > current:
            started: list[Managed] = []
            try:
                for p in bigger.engines[len(plan.engines):]:
                    started.append(self.sup.start(p.spec))
            except LaunchError:
                for m in started:
                    self.sup.retire(m, self.grace_s)
                raise
            self.plan = bigger
            self.joining.update((m.spec.name, m) for m in started)
            return (f"{req.engine}: {current} -> {req.replicas} replicas; starting "
                    + ", ".join(m.spec.name for m in started))
        if req.replicas == current:
            return f"{req.engine}: already {current} replicas"
        victims = [f"{req.engine}-{r}" for r in range(req.replicas, current)]
        deadline = time.monotonic() + self.drain_timeout_s
        for name in victims:
            proc = next(m for m in self.sup.procs if m.spec.name == name)
            self.admin(name, "down", {"reason": "draining (scale down)"}, None)
            self.draining[name] = _Drain(proc, deadline)
        self.target[req.engine] = req.replicas
        return (f"{req.engine}: {current} -> {req.replicas} replicas; draining "
                + ", ".join(victims))

    def _drains(self) -> None:
        for name, d in list(self.draining.items()):
            open_ = self.inflight(name)
            if open_ and time.monotonic() < d.deadline:
                continue
            if open_ is None and d.proc.state is State.UP and time.monotonic() < d.deadline:
                continue  # the router did not answer: wait (it may be restarting)
            status = self.admin(name, "remove", None, None)
            if status != 200 and time.monotonic() < d.deadline:
                continue
            self.sup.retire(d.proc, self.grace_s)
            del self.draining[name]
            self.console.line(f"{name} drained and stopped"
                              + ("" if open_ == 0 else " (drain timeout)"))
        for engine, n in list(self.target.items()):
            if not any(name.rsplit("-", 1)[0] == engine for name in self.draining):
                self.plan = with_replicas(self.plan, engine, n)
                del self.target[engine]
                self.on_change(self.plan)
