"""Process supervision: start, health-check, restart with backoff, stop whole trees.

Every child runs in its own session (its own process group, out of reach of the
terminal's Ctrl-C, so the launcher decides the order of shutdown), gets SIGTERM if the
launcher dies (``PR_SET_PDEATHSIG`` on Linux), and carries ``HETSERVE_RUN_DIR`` in its
environment, inherited by all its descendants. A process's tree is what shares one of
its sessions plus every descendant seen while it ran: vLLM's EngineCore and workers
rename themselves (setproctitle), which blanks the environment /proc shows, so the
marker alone misses them, and they outlive a killed API server. ``stop_all`` kills by
tree and finally by the marker, so no process of the cluster outlives the launcher. The
supervisor is single-threaded: the caller drives it with ``step()``.

A process whose spec has a ``placement`` runs elsewhere (a Ray actor's engine on some
node, ``launcher.ray_backend``): the supervisor starts it with ``remote_start`` and
polls, stops and restarts it through the ``RemoteProcess`` it returns; a restart may
land it at another address (a ``moved`` event).

A process that is up keeps being health-checked every ``health_interval_s``; after
``unhealthy_after`` failed checks in a row it is taken as wedged (hung, stopped, deadlocked):
its tree is killed and it is restarted like a process that exited. A process that has
stayed up for ``stable_s`` gets its restart budget (and backoff) back.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import httpx
import psutil

from launcher import LaunchError

MARKER_ENV = "HETSERVE_RUN_DIR"
"""Environment variable set in every process of a cluster: its run directory."""

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessSpec:
    """How to run one supervised process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    """Set on top of the launcher's own environment."""
    log_path: Path
    health_url: str | None
    """Healthy once this answers 200 (``None``: once started)."""
    nice: int = 0
    """Niceness added to the process (and so to its children)."""
    placement: Any = None
    """Where a remote process runs (``launcher.ray_backend.RayPlacement``); None: here."""


class RemoteProcess(Protocol):
    """A process the supervisor runs through another system (``Supervisor.remote_start``)."""

    pid: int
    url: str
    """Its base URL (health is ``url + "/health"``)."""
    where: str
    """Where it runs (node address and id), as the launcher's table shows it."""

    def poll(self) -> str | None:
        """None while it runs; else why it ended."""

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM: it stops its own children)."""

    def alive(self) -> bool:
        """Whether any process of it is still running."""

    def kill(self) -> None:
        """Kill whatever is left of it and release what it held (idempotent)."""

    def tail(self, lines: int) -> str:
        """The last lines of its log."""


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
    popen: subprocess.Popen[bytes] | None = None
    remote: RemoteProcess | None = None
    state: State = State.STARTING
    started_at: float = 0.0
    restarts: int = 0
    restart_at: float = 0.0
    up_since: float = 0.0
    checked_at: float = 0.0
    failed_checks: int = 0
    """Failed health checks in a row while up."""
    last_exit: str = ""
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    """Descendants seen while it ran (psutil notices if a pid is reused)."""
    sessions: set[int] = field(default_factory=set)
    """Session ids of its runs that may still have members (a session id is the pid
    of the run's first process, which Linux does not reuse while the session lives)."""

    @property
    def pid(self) -> int | None:
        if self.remote is not None:
            return self.remote.pid
        return self.popen.pid if self.popen else None

    @property
    def health_url(self) -> str | None:
        if self.remote is not None:
            return self.remote.url + "/health"
        return self.spec.health_url

    @property
    def running(self) -> bool:
        """Started (here or remotely) and not yet cleaned up."""
        return self.popen is not None or self.remote is not None


@dataclass(frozen=True)
class Event:
    """A state change ``step()`` reports: ``up``, ``down`` (restart pending), ``failed``,
    or ``moved`` (restarting with a changed spec, ``before_restart``)."""

    kind: str
    proc: Managed
    detail: str = ""


class Supervisor:
    """Runs a set of processes for one cluster (identified by its run directory)."""

    def __init__(self, run_dir: Path, *, health_timeout_s: float, max_restarts: int,
                 backoff_s: float, backoff_max_s: float, health_interval_s: float = 5.0,
                 unhealthy_after: int = 3, stable_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic,
                 remote_start: Callable[[ProcessSpec], RemoteProcess] | None = None) -> None:
        """``remote_start``: starts a spec with a ``placement`` (LaunchError: it cannot be
        placed now)."""
        self.run_dir = run_dir
        self.remote_start = remote_start
        self.health_timeout_s = health_timeout_s
        self.health_interval_s = health_interval_s
        self.unhealthy_after = unhealthy_after
        self.stable_s = stable_s
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
        return spawn(argv, self._env(env), stdout=None)

    def step(self, restart: bool) -> list[Event]:
        """Check every process once: exits, health, due restarts (only if ``restart``)."""
        events: list[Event] = []
        now = self.clock()
        for m in self.procs:
            if m.state in (State.STARTING, State.UP):
                ended = self._poll(m)
                if ended is not None:
                    events.append(self._exited(m, ended, restart))
                elif m.state is State.STARTING:
                    if self._healthy(m.health_url):
                        m.state = State.UP
                        m.up_since = m.checked_at = now
                        m.failed_checks = 0
                        events.append(Event("up", m, f"{now - m.started_at:.0f} s"))
                    elif now - m.started_at > self.health_timeout_s:
                        events.append(self._exited(
                            m, f"not healthy after {self.health_timeout_s:g} s", restart))
                else:
                    events += self._watch(m, now, restart)
            elif m.state is State.DOWN and restart and now >= m.restart_at:
                m.restarts += 1
                moved = self.before_restart(m) if self.before_restart else None
                if moved:
                    events.append(Event("moved", m, moved))
                events += self._respawn(m, restart)
        return events

    def _poll(self, m: Managed) -> str | None:
        """None while ``m`` runs, else why it ended."""
        if m.remote is not None:
            return m.remote.poll()
        assert m.popen is not None
        self._remember_tree(m)
        code = m.popen.poll()
        return None if code is None else describe_exit(code)

    def _respawn(self, m: Managed, restart: bool) -> list[Event]:
        """Restart ``m``; a remote one may land elsewhere (``moved``) or find no room."""
        before = (m.remote.url, m.remote.where) if m.remote is not None else None
        try:
            self._spawn(m)
        except LaunchError as e:
            return [self._exited(m, str(e), restart)]
        if (m.remote is not None and before is not None
                and (m.remote.url, m.remote.where) != before):
            return [Event("moved", m, f"re-placed on {m.remote.where} at {m.remote.url} "
                                      f"(was {before[1]} at {before[0]})")]
        return []

    def _watch(self, m: Managed, now: float, restart: bool) -> list[Event]:
        """A process that is up: the periodic health check and the stable-period reset."""
        if m.restarts and now - m.up_since >= self.stable_s:
            m.restarts = 0
        if m.health_url is None or now - m.checked_at < self.health_interval_s:
            return []
        m.checked_at = now
        if self._healthy(m.health_url):
            m.failed_checks = 0
            return []
        m.failed_checks += 1
        if m.failed_checks < self.unhealthy_after:
            return []
        return [self._exited(m, f"wedged: {m.failed_checks} health checks failed in a row",
                             restart)]

    def _spawn(self, m: Managed) -> None:
        if m.spec.placement is not None:
            if self.remote_start is None:
                raise LaunchError(f"{m.spec.name}: a placed process needs remote_start")
            m.remote = None  # the old one is released; a failed placement leaves none
            m.remote = self.remote_start(m.spec)
            m.state = State.STARTING
            m.started_at = self.clock()
            return
        mode = "ab" if m.restarts else "wb"
        with open(m.spec.log_path, mode) as log:
            if m.restarts:
                log.write(f"\n---- launcher: restart {m.restarts} ----\n".encode())
                log.flush()
            m.popen = spawn(m.spec.argv, self._env(m.spec.env), stdout=log, nice=m.spec.nice)
        m.state = State.STARTING
        m.started_at = self.clock()
        m.sessions.add(m.popen.pid)

    def _exited(self, m: Managed, reason: str, restart: bool) -> Event:
        """Clean up what is left of ``m``'s tree and decide on its restart."""
        if m.remote is not None:
            m.remote.kill()
        else:
            kill_procs(self._tree(m), m.popen, signal.SIGKILL)
            reap(m.popen, 5.0)
        m.last_exit = reason
        if restart and m.restarts < self.max_restarts:
            delay = min(self.backoff_s * 2 ** m.restarts, self.backoff_max_s)
            m.state = State.DOWN
            m.restart_at = self.clock() + delay
            return Event("down", m, f"{reason}; restart {m.restarts + 1} of "
                                    f"{self.max_restarts} in {delay:g} s")
        m.state = State.FAILED
        return Event("failed", m, reason + (f"; gave up after {m.restarts} restarts"
                                            if restart else ""))

    def _healthy(self, url: str | None) -> bool:
        if url is None:
            return True
        try:
            return self._http.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return {**os.environ, **extra, MARKER_ENV: str(self.run_dir)}

    # ---- stopping

    def stop_all(self, grace_s: float, first: Iterable[Managed] = (),
                 helpers: Iterable[subprocess.Popen[bytes]] = ()) -> None:
        """Graceful shutdown: SIGTERM to ``helpers``, then ``first`` (the router, which
        finishes its in-flight requests), then the rest once ``first`` is gone or half
        the grace period has passed; SIGKILL whatever is left when it ends."""
        t0 = self.clock()
        for h in helpers:
            kill_procs([], h, signal.SIGTERM)
        first = [m for m in first if m.running]
        rest = [m for m in self.procs if m.running and m not in first]
        for m in first:
            self._terminate(m)
        self._wait(first, t0 + grace_s / 2)
        for m in rest:
            self._terminate(m)
        self._wait(self.procs, t0 + grace_s)
        leftovers = self.marked()
        for m in self.procs:
            if m.remote is not None:
                m.remote.kill()
            elif m.popen:
                leftovers += self._tree(m)
                kill_procs(self._tree(m), m.popen, signal.SIGKILL)
        for h in helpers:
            kill_procs([], h, signal.SIGKILL)
        kill_procs(leftovers, None, signal.SIGKILL)
        deadline = self.clock() + 5.0
        while any(alive(p) for p in leftovers) and self.clock() < deadline:
            time.sleep(0.05)
        for m in self.procs:
            reap(m.popen, 5.0)
            m.state = State.STOPPED
        for h in helpers:
            reap(h, 5.0)
        self._http.close()

    def retire(self, m: Managed, grace_s: float) -> None:
        """Stop ``m`` for good (a replica scaled away): SIGTERM, SIGKILL after
        ``grace_s``, and no restart."""
        if m.running:
            self._terminate(m)
            self._wait([m], self.clock() + grace_s)
            if m.remote is not None:
                m.remote.kill()
            else:
                kill_procs(self._tree(m), m.popen, signal.SIGKILL)
                reap(m.popen, 5.0)
        m.state = State.STOPPED
        self.procs.remove(m)

    def _terminate(self, m: Managed) -> None:
        """SIGTERM to the process itself (it stops its own children), or to what is left
        of its tree if it is gone already."""
        if m.remote is not None:
            m.remote.terminate()
            return
        self._remember_tree(m)
        assert m.popen is not None
        if m.popen.poll() is None:
            m.popen.send_signal(signal.SIGTERM)
        else:
            kill_procs(self._tree(m), None, signal.SIGTERM)

    def _wait(self, procs: list[Managed], deadline: float) -> None:
        while not self.force and self.clock() < deadline:
            if not any(m.remote.alive() if m.remote is not None else
                       any(alive(p) for p in self._tree(m)) for m in procs):
                return
            time.sleep(0.1)

    def marked(self) -> list[psutil.Process]:
        """Every live process whose environment names this cluster's run directory."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER_ENV) == str(self.run_dir) and alive(p):
                    out.append(p)
            except (psutil.Error, OSError):
                continue
        return out

    def _remember_tree(self, m: Managed) -> None:
        if m.popen is None:
            return
        try:
            kids = psutil.Process(m.popen.pid).children(recursive=True)
        except psutil.Error:
            return
        m.seen.update((k.pid, k) for k in kids if k.pid not in m.seen)

    def _tree(self, m: Managed) -> list[psutil.Process]:
        """The live processes of ``m``: members of its sessions and descendants seen
        (they may have been re-parented). Dead descendants and empty sessions are
        forgotten."""
        m.seen = {pid: p for pid, p in m.seen.items() if alive(p)}
        out = dict(m.seen)
        occupied: set[int] = set()
        for p in psutil.process_iter():
            try:
                sid = os.getsid(p.pid)
            except OSError:
                continue
            if sid in m.sessions and alive(p):
                occupied.add(sid)
                out.setdefault(p.pid, p)
        m.sessions &= occupied
        return list(out.values())

    def tail(self, m: Managed, lines: int = 20) -> str:
        """The last lines of ``m``'s log."""
        if m.remote is not None:
            return m.remote.tail(lines)
        return tail_file(m.spec.log_path, lines)


# ---------------------------------------------------------------- process helpers


def spawn(argv: list[str], env: dict[str, str], stdout: IO[bytes] | None, nice: int = 0
          ) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, to get SIGTERM when this process dies, ``nice``
    added to its niceness."""
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT if stdout is not None else None,
                            start_new_session=True, preexec_fn=_preexec(os.getpid(), nice))


def _preexec(parent: int, nice: int) -> Callable[[], None]:
    linux = sys.platform.startswith("linux")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if linux else None

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os._exit(1)
        if nice:
            os.nice(nice)
            with contextlib.suppress(OSError):  # the session's scheduling group (Linux
                with open("/proc/self/autogroup", "w") as f:  # autogroup): without it,
                    f.write(str(nice))  # other sessions never see this niceness

    return preexec


def kill_procs(procs: list[psutil.Process], popen: subprocess.Popen[bytes] | None,
          sig: signal.Signals) -> None:
    """Signal ``popen``'s process group (while its leader lives) and each of ``procs``."""
    if popen is not None and popen.poll() is None:
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def reap(popen: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if popen is None:
        return
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tail_file(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file (of its last 16 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


def describe_exit(code: int) -> str:
    """A process's exit, as the launcher reports it."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
