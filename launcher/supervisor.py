"""Process supervision: start, health-check, restart with backoff, stop whole trees.

The supervisor starts every process through its backend (``launcher.backends``) and
knows it only by its ``launcher.process.ProcessHandle``: a process here, or an engine on
a Ray node, alike. A restart may land a process elsewhere (a ``moved`` event).
``stop_all`` stops by tree and finally by the run directory's marker, so no process of
the cluster here outlives the launcher. The supervisor is single-threaded: the caller
drives it with ``step()``.

A process that is up keeps being health-checked every ``health_interval_s``; after
``unhealthy_after`` failed checks in a row it is taken as wedged (hung, stopped, deadlocked):
its tree is killed and it is restarted like a process that exited. The restart budget
(``max_restarts``) and the backoff count only the restarts of the last
``restart_window_s``.

While a process that yields (``ProcessSpec.yield_nice``: engines on CPU cores) restarts,
the others that yield and are up run with that much more niceness in their session's
scheduling group: on a CPU-only machine the engines carrying the load otherwise take the
cores a restarting engine needs to import and load (measured: a restart 4-5 times slower
than a cold start), and its recovery has no bound.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from launcher import LaunchError
from launcher.backends.base import Backend
from launcher.backends.local import LocalBackend
from launcher.process import (MARKER_ENV, ProcessHandle, ProcessSpec, ProcessTree, alive,
                              marked, spawn, tail_file)


class State(enum.Enum):
    STARTING = "starting"
    UP = "up"
    DOWN = "down"
    """Exited; waiting for its restart."""
    FAILED = "failed"
    """Exited and will not be restarted."""
    STOPPED = "stopped"


@dataclass
class Managed:
    """A supervised process and its history."""

    spec: ProcessSpec
    handle: ProcessHandle | None = None
    """Its current run (None: not started, or its re-placement failed)."""
    state: State = State.STARTING
    started_at: float = 0.0
    restarts: int = 0
    """Restarts since it was first started (the backend's run index)."""
    restart_times: list[float] = field(default_factory=list)
    """When its restarts within the last ``restart_window_s`` happened (the budget)."""
    restart_at: float = 0.0
    checked_at: float = 0.0
    failed_checks: int = 0
    """Failed health checks in a row while up."""
    last_exit: str = ""
    session_nice: int = 0
    """The niceness its session's scheduling group was last given."""

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle is not None else None


@dataclass(frozen=True)
class Event:
    """A state change ``step()`` reports: ``up``, ``down`` (restart pending), ``failed``,
    or ``moved`` (restarting elsewhere: with a changed spec, ``before_restart``, or
    re-placed by its backend)."""

    kind: str
    proc: Managed
    detail: str = ""


class Supervisor:
    """Runs a set of processes for one cluster (identified by its run directory)."""

    def __init__(self, run_dir: Path, *, health_timeout_s: float, max_restarts: int,
                 backoff_s: float, backoff_max_s: float, health_interval_s: float = 5.0,
                 unhealthy_after: int = 3, restart_window_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic,
                 backend: Backend | None = None) -> None:
        """``backend``: starts the processes (default: here, ``LocalBackend``)."""
        self.run_dir = run_dir
        self.backend = backend or LocalBackend(run_dir)
        self.health_timeout_s = health_timeout_s
        self.health_interval_s = health_interval_s
        self.unhealthy_after = unhealthy_after
        self.restart_window_s = restart_window_s
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.procs: list[Managed] = []
        self.force = False
        """Set (e.g. on a second Ctrl-C) to make a running ``stop_all`` kill at once."""
        self.before_restart: Callable[[Managed], str | None] | None = None
        """Called just before a process is restarted; may replace its ``spec`` (a new
        port) and return what changed, reported as a ``moved`` event."""
        self._http = httpx.Client(timeout=2.0)

    # ---- starting and watching

    def start(self, spec: ProcessSpec) -> Managed:
        """Start ``spec`` and supervise it (LaunchError, OSError: it did not start, and
        is not supervised)."""
        m = Managed(spec)
        self._spawn(m)
        self.procs.append(m)
        return m

    def spawn_plain(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start an unsupervised helper (output to the terminal) that ``stop_all`` ends too."""
        return spawn(argv, {**os.environ, **env, MARKER_ENV: str(self.run_dir)}, stdout=None)

    def step(self, restart: bool) -> list[Event]:
        """Check every process once: exits, health, due restarts (only if ``restart``)."""
        events: list[Event] = []
        now = self.clock()
        for m in self.procs:
            if m.state in (State.STARTING, State.UP):
                assert m.handle is not None
                ended = m.handle.poll()
                if ended is not None:
                    events.append(self._exited(m, ended, restart))
                elif m.state is State.STARTING:
                    if self._healthy(m.handle.health_url):
                        m.state = State.UP
                        m.checked_at = now
                        m.failed_checks = 0
                        events.append(Event("up", m, f"{now - m.started_at:.0f} s"))
                    elif now - m.started_at > self.health_timeout_s:
                        events.append(self._exited(
                            m, f"not healthy after {self.health_timeout_s:g} s", restart))
                else:
                    events += self._watch(m, m.handle, now, restart)
            elif m.state is State.DOWN and restart and now >= m.restart_at:
                m.restarts += 1
                m.restart_times.append(now)
                moved = self.before_restart(m) if self.before_restart else None
                if moved:
                    events.append(Event("moved", m, moved))
                events += self._respawn(m, restart)
        self._yield_to_restarts()
        return events

    def _yield_to_restarts(self) -> None:
        """While a process that yields restarts, the others that yield run with their
        ``yield_nice`` added; else with their own niceness."""
        restarting = any(m.spec.yield_nice and m.restarts and m.state is State.STARTING
                         for m in self.procs)
        for m in self.procs:
            if not m.spec.yield_nice or m.state is not State.UP or m.handle is None:
                continue
            nice = min(19, m.spec.nice + m.spec.yield_nice) if restarting else m.spec.nice
            if nice != m.session_nice and m.handle.renice(nice):
                m.session_nice = nice

    def _respawn(self, m: Managed, restart: bool) -> list[Event]:
        """Restart ``m``; it may land elsewhere (``moved``) or find no room."""
        before = m.handle
        try:
            self._spawn(m)
        except LaunchError as e:
            return [self._exited(m, str(e), restart)]
        assert m.handle is not None
        moved = m.handle.moved_from(before) if before is not None else None
        return [Event("moved", m, moved)] if moved else []

    def _watch(self, m: Managed, handle: ProcessHandle, now: float, restart: bool
               ) -> list[Event]:
        """A process that is up: the periodic health check."""
        if handle.health_url is None or now - m.checked_at < self.health_interval_s:
            return []
        m.checked_at = now
        if self._healthy(handle.health_url):
            m.failed_checks = 0
            return []
        m.failed_checks += 1
        if m.failed_checks < self.unhealthy_after:
            return []
        return [self._exited(m, f"wedged: {m.failed_checks} health checks failed in a row",
                             restart)]

    def _spawn(self, m: Managed) -> None:
        m.handle = None  # the old run is released; a failed start leaves none
        m.handle = self.backend.start(m.spec, m.restarts)
        m.session_nice = m.spec.nice
        m.state = State.STARTING
        m.started_at = self.clock()

    def _exited(self, m: Managed, reason: str, restart: bool) -> Event:
        """Clean up what is left of ``m``'s tree and decide on its restart."""
        if m.handle is not None:
            m.handle.kill()
        m.last_exit = reason
        now = self.clock()
        m.restart_times = [t for t in m.restart_times if now - t < self.restart_window_s]
        spent = len(m.restart_times)
        if restart and spent < self.max_restarts:
            delay = min(self.backoff_s * 2 ** spent, self.backoff_max_s)
            m.state = State.DOWN
            m.restart_at = now + delay
            return Event("down", m, f"{reason}; restart {spent + 1} of "
                                    f"{self.max_restarts} in {delay:g} s")
        m.state = State.FAILED
        return Event("failed", m, reason + (
            f"; gave up after {spent} restarts in {self.restart_window_s:g} s"
            if restart else ""))

    def _healthy(self, url: str | None) -> bool:
        if url is None:
            return True
        try:
            return self._http.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    # ---- stopping

    def stop_all(self, grace_s: float, first: Iterable[Managed] = (),
                 helpers: Iterable[subprocess.Popen[bytes]] = ()) -> None:
        """Graceful shutdown: SIGTERM to ``helpers``, then ``first`` (the router, which
        finishes its in-flight requests), then the rest once ``first`` is gone or half
        the grace period has passed; SIGKILL whatever is left when it ends."""
        t0 = self.clock()
        trees = [ProcessTree(h) for h in helpers]
        for t in trees:
            t.signal(signal.SIGTERM, [])
        running = [m.handle for m in self.procs if m.handle is not None]
        first = [m.handle for m in first if m.handle is not None]
        for h in first:
            h.terminate()
        self._wait(first, t0 + grace_s / 2)
        for h in running:
            if h not in first:
                h.terminate()
        self._wait(running, t0 + grace_s)
        leftovers = self.marked()
        for h in running:
            h.kill()
        for t in trees:
            t.signal(signal.SIGKILL, [])
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        deadline = self.clock() + 5.0
        while (any(alive(p) for p in leftovers) or any(h.alive() for h in running)) \
                and self.clock() < deadline:
            time.sleep(0.05)
        for m in self.procs:
            m.state = State.STOPPED
        for t in trees:
            t.reap()
        self._http.close()

    def retire(self, m: Managed, grace_s: float) -> None:
        """Stop ``m`` for good (a replica scaled away): SIGTERM, SIGKILL after
        ``grace_s``, and no restart."""
        if m.handle is not None:
            m.handle.terminate()
            self._wait([m.handle], self.clock() + grace_s)
            m.handle.kill()
        m.state = State.STOPPED
        self.procs.remove(m)

    def _wait(self, handles: list[ProcessHandle], deadline: float) -> None:
        while not self.force and self.clock() < deadline:
            if not any(h.alive() for h in handles):
                return
            time.sleep(0.1)

    def marked(self) -> list[psutil.Process]:
        """Every live process whose environment names this cluster's run directory."""
        return marked(self.run_dir)

    def tail(self, m: Managed, lines: int = 20) -> str:
        """The last lines of ``m``'s log."""
        return m.handle.tail(lines) if m.handle is not None else tail_file(m.spec.log_path,
                                                                           lines)
