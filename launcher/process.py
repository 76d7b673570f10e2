"""A started process as the supervisor sees it: its spec, its handle, its tree.

Every local child runs in its own session (its own process group, out of reach of the
terminal's Ctrl-C, so the launcher decides the order of shutdown), gets SIGTERM if its
parent dies (``PR_SET_PDEATHSIG`` on Linux), and carries ``HETSERVE_RUN_DIR`` in its
environment, inherited by all its descendants. A process's tree (``ProcessTree``) is
what shares its session plus every descendant seen while it ran: vLLM's EngineCore and
workers rename themselves (setproctitle), which blanks the environment /proc shows, so
the marker alone misses them, and they outlive a killed API server. The same tree kills
an engine on this machine (``launcher.backends.local``) and one on a Ray node
(``launcher.backends.ray``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import psutil

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
    yield_nice: int = 0
    """Niceness added to its session's scheduling group (Linux autogroup) while another
    process that yields restarts (``Supervisor``), so the restart is not starved by the
    processes carrying its load; 0: it never yields."""
    placement: Any = None
    """Where a placed process runs (``launcher.backends.ray.RayPlacement``); None: here."""
    pass_fds: tuple[int, ...] = ()
    """Descriptors it inherits, at the same numbers (the router workers' shared socket,
    ``launcher.listener``)."""


class ProcessHandle(Protocol):
    """One run of a started process, wherever its backend started it."""

    pid: int
    health_url: str | None
    """Healthy once this answers 200 (``None``: once started)."""
    where: str
    """Where it runs (``local``, or a node's address and id), as the launcher shows it."""

    def poll(self) -> str | None:
        """None while it runs; else why it ended."""

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM: it stops its own children)."""

    def alive(self) -> bool:
        """Whether any process of its tree is still running."""

    def kill(self) -> None:
        """Kill whatever is left of its tree and release what it held (idempotent)."""

    def renice(self, nice: int) -> bool:
        """Set the niceness of its session's scheduling group (Linux autogroup) where the
        backend can; whether it was set."""

    def tail(self, lines: int) -> str:
        """The last lines of its log."""

    def moved_from(self, before: ProcessHandle) -> str | None:
        """How this run moved from where ``before`` (its previous run) served; None: it
        serves where it did."""


class ProcessTree:
    """A process started in a session of its own (``spawn``) and all it started."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.seen: dict[int, psutil.Process] = {}
        """Descendants seen while it ran (psutil notices if a pid is reused)."""
        self.session: int | None = popen.pid
        """Its session id (the leader's pid, which Linux does not reuse while the session
        lives); None once the session is empty."""

    def remember(self) -> None:
        """Note the leader's descendants now (they may be re-parented later)."""
        try:
            kids = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.Error:
            return
        self.seen.update((k.pid, k) for k in kids if k.pid not in self.seen)

    def members(self) -> list[psutil.Process]:
        """The live processes of the tree: members of its session and descendants seen.
        Dead descendants and an empty session are forgotten."""
        self.seen = {pid: p for pid, p in self.seen.items() if alive(p)}
        out = dict(self.seen)
        occupied = False
        if self.session is not None:
            for p in psutil.process_iter():
                try:
                    sid = os.getsid(p.pid)
                except OSError:
                    continue
                if sid == self.session and alive(p):
                    occupied = True
                    out.setdefault(p.pid, p)
        if not occupied:
            self.session = None
        return list(out.values())

    def alive(self) -> bool:
        return any(alive(p) for p in self.members())

    def terminate(self) -> None:
        """SIGTERM to the leader (it stops its own children), or to what is left of the
        tree if it is gone already."""
        self.remember()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        else:
            self.signal(signal.SIGTERM, self.members())

    def kill(self) -> list[psutil.Process]:
        """SIGKILL the leader's group and every member; the members signalled."""
        self.remember()
        members = self.members()
        self.signal(signal.SIGKILL, members)
        return members

    def signal(self, sig: signal.Signals, procs: list[psutil.Process]) -> None:
        """Signal the leader's process group (while the leader lives) and each of
        ``procs``."""
        signal_group(self.popen, sig)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def reap(self, timeout: float = 5.0) -> None:
        """Wait for the leader (SIGKILL after ``timeout``)."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal ``popen``'s process group while its leader lives."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)


def spawn(argv: list[str], env: dict[str, str], stdout: IO[bytes] | None, nice: int = 0,
          pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, to get SIGTERM when this process dies, ``nice``
    added to its niceness, inheriting ``pass_fds`` (no other descriptor)."""
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT if stdout is not None else None,
                            start_new_session=True, preexec_fn=_preexec(os.getpid(), nice),
                            pass_fds=pass_fds)


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
            # the session's scheduling group (Linux autogroup): without it, other
            # sessions never see this niceness
            set_session_nice("self", nice)

    return preexec


def set_session_nice(pid: int | str, nice: int) -> bool:
    """Set the niceness of the Linux autogroup of ``pid``'s session (``self``: this
    process's); whether it was set (no autogroup, a process gone, or the kernel's limit of
    ten changes a second for unprivileged callers: not)."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        return False
    return True


def marked(run_dir: Path) -> list[psutil.Process]:
    """Every live process whose environment names the cluster of ``run_dir``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER_ENV) == str(run_dir) and alive(p):
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


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
