"""launcher.supervisor's process handling, against a stand-in server (not an engine).

The stand-in answers ``GET /health`` and starts a grandchild that ignores SIGTERM, like a
server whose worker outlives it: the supervisor must still leave nothing behind. In
mode ``bare`` the grandchild's environment is empty, as /proc shows vLLM's EngineCore
and workers once they have renamed themselves: no run-directory marker to find it by.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from launcher.backends.local import LocalProcess
from launcher.ports import port_is_free
from launcher.process import ProcessSpec
from launcher.supervisor import Event, Managed, State, Supervisor

STAND_IN = r'''
import http.server, os, subprocess, sys
port, mode = int(sys.argv[1]), sys.argv[2]
print("stand-in starting", mode, flush=True)
if mode == "crash":
    print("boom: stand-in crashed", flush=True)
    sys.exit(3)
subprocess.Popen([sys.executable, "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(600)"], env={} if mode == "bare" else None)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        healthy = mode in ("ok", "bare") or mode.startswith("gate=") and os.path.exists(mode[5:])
        self.send_response(200 if self.path == "/health" and healthy else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


_handed_out: set[int] = set()


def free_port() -> int:
    port = 20000 + os.getpid() % 20000
    while port in _handed_out or not port_is_free("127.0.0.1", port):
        port += 1
    _handed_out.add(port)
    return port


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    s = Supervisor(tmp_path, health_timeout_s=20, max_restarts=2, backoff_s=0.2,
                   backoff_max_s=1.0)
    yield s
    s.stop_all(grace_s=2)


def spec(tmp_path: Path, mode: str = "ok", name: str = "stand-in") -> ProcessSpec:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    return ProcessSpec(name=name, argv=[sys.executable, str(script), str(port), mode],
                       env={"STAND_IN": "1"}, log_path=tmp_path / f"{name}.log",
                       health_url=f"http://127.0.0.1:{port}/health")


def run_until(sup: Supervisor, done: Callable[[list[Event]], bool], restart: bool = True,
              timeout: float = 30) -> list[Event]:
    """Step ``sup`` until ``done(events)`` is true; return all events seen."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events += sup.step(restart=restart)
        if done(events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"timed out; events: {[(e.kind, e.detail) for e in events]}")


def tree(m: Managed) -> list[psutil.Process]:
    assert m.pid is not None
    root = psutil.Process(m.pid)
    return [root] + root.children(recursive=True)


def gone(procs: list[psutil.Process]) -> bool:
    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return not any(alive(p) for p in procs)


def gone_within(procs: list[psutil.Process], timeout_s: float = 10.0) -> bool:
    """``gone``, allowing for SIGKILL delivery and reaping on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while not gone(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone(procs)


def test_up_then_restart_after_crash(sup: Supervisor, tmp_path: Path) -> None:
    m = sup.start(spec(tmp_path))
    run_until(sup, lambda ev: m.state is State.UP and len(tree(m)) == 2)
    old = tree(m)
    env = old[0].environ()
    assert env["STAND_IN"] == "1" and env["HETSERVE_RUN_DIR"] == str(tmp_path)
    assert os.getpgid(m.pid) == m.pid  # its own process group
    os.kill(m.pid, signal.SIGKILL)
    events = run_until(sup, lambda ev: [e.kind for e in ev] == ["down", "up"])
    assert events[0].detail == "killed by SIGKILL; restart 1 of 2 in 0.2 s"
    assert m.restarts == 1 and m.pid != old[0].pid
    assert gone_within(old)  # the orphaned grandchild was cleaned up too
    assert "---- launcher: restart 1 ----" in (tmp_path / "stand-in.log").read_text()


def test_killed_server_takes_descendants_without_the_marker(sup: Supervisor,
                                                             tmp_path: Path) -> None:
    # The server dies before any step() has seen its child: only its session finds it.
    m = sup.start(spec(tmp_path, mode="bare"))
    deadline = time.monotonic() + 20
    while len(tree(m)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    orphan = tree(m)[1]
    assert "HETSERVE_RUN_DIR" not in orphan.environ()
    os.kill(m.pid, signal.SIGKILL)
    events = run_until(sup, lambda ev: bool(ev), restart=False)
    assert [(e.kind, e.detail) for e in events] == [("failed", "killed by SIGKILL")]
    assert gone_within([orphan])


def test_gives_up_after_max_restarts(sup: Supervisor, tmp_path: Path) -> None:
    m = sup.start(spec(tmp_path, mode="crash"))
    events = run_until(sup, lambda ev: ev and ev[-1].kind == "failed")
    assert [e.kind for e in events] == ["down", "down", "failed"]
    assert events[-1].detail == "exited with code 3; gave up after 2 restarts in 600 s"
    assert m.state is State.FAILED


def test_start_up_failure_is_final_and_logged(sup: Supervisor, tmp_path: Path) -> None:
    m = sup.start(spec(tmp_path, mode="crash"))
    events = run_until(sup, lambda ev: bool(ev), restart=False)
    assert [(e.kind, e.detail) for e in events] == [("failed", "exited with code 3")]
    assert sup.tail(m).splitlines()[-1] == "boom: stand-in crashed"


def test_health_timeout(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, health_timeout_s=1.5, max_restarts=0, backoff_s=0.1,
                     backoff_max_s=0.1)
    try:
        m = sup.start(spec(tmp_path, mode="unhealthy"))
        run_until(sup, lambda ev: m.state is State.STARTING and len(tree(m)) == 2)
        procs = tree(m)
        events = run_until(sup, lambda ev: bool(ev), restart=False)
        assert [(e.kind, e.detail) for e in events] == [("failed", "not healthy after 1.5 s")]
        assert gone_within(procs)
    finally:
        sup.stop_all(grace_s=1)


def test_stop_all_leaves_nothing(sup: Supervisor, tmp_path: Path) -> None:
    first = sup.start(spec(tmp_path, name="first"))
    second = sup.start(spec(tmp_path, name="second"))
    run_until(sup, lambda ev: all(m.state is State.UP and len(tree(m)) == 2
                                  for m in (first, second)))
    procs = tree(first) + tree(second)
    helper = sup.spawn_plain([sys.executable, "-c", "import time; time.sleep(600)"], {})
    procs.append(psutil.Process(helper.pid))
    t0 = time.monotonic()
    sup.stop_all(grace_s=2, first=[first], helpers=[helper])
    assert time.monotonic() - t0 < 2 + 3  # grace, then SIGKILL and reaping
    assert gone_within(procs)
    assert not sup.marked()
    assert isinstance(first.handle, LocalProcess)
    assert first.handle.tree.popen.returncode == -signal.SIGTERM


def test_a_wedged_process_is_restarted(tmp_path: Path) -> None:
    """SIGSTOP keeps the process alive and its port open, but /health goes unanswered."""
    sup = Supervisor(tmp_path, health_timeout_s=20, max_restarts=1, backoff_s=0.1,
                     backoff_max_s=0.1, health_interval_s=0.2, unhealthy_after=2)
    try:
        m = sup.start(spec(tmp_path))
        run_until(sup, lambda ev: m.state is State.UP and len(tree(m)) == 2)
        stopped = tree(m)
        os.kill(m.pid, signal.SIGSTOP)
        events = run_until(sup, lambda ev: [e.kind for e in ev] == ["down", "up"])
        assert events[0].detail == ("wedged: 2 health checks failed in a row; restart 1 of "
                                    "1 in 0.1 s")
        assert gone_within(stopped) and m.pid != stopped[0].pid
    finally:
        sup.stop_all(grace_s=1)


@pytest.mark.parametrize("window_s", [0.5, 60.0])
def test_the_restart_budget_counts_the_window_s_restarts(tmp_path: Path,
                                                        window_s: float) -> None:
    """A second crash after the first restart left the window is restarted again, with
    the first backoff; within the window it is given up on."""
    sup = Supervisor(tmp_path, health_timeout_s=20, max_restarts=1, backoff_s=0.1,
                     backoff_max_s=0.1, restart_window_s=window_s)
    try:
        m = sup.start(spec(tmp_path))
        run_until(sup, lambda ev: m.state is State.UP and len(tree(m)) == 2)
        os.kill(m.pid, signal.SIGKILL)
        run_until(sup, lambda ev: [e.kind for e in ev] == ["down", "up"])
        assert m.restarts == 1
        time.sleep(0.6)
        os.kill(m.pid, signal.SIGKILL)
        if window_s < 0.6:
            events = run_until(sup, lambda ev: [e.kind for e in ev] == ["down", "up"])
            assert events[0].detail == "killed by SIGKILL; restart 1 of 1 in 0.1 s"
            assert m.restarts == 2
        else:
            events = run_until(sup, lambda ev: [e.kind for e in ev] == ["failed"])
            assert events[0].detail == ("killed by SIGKILL; gave up after 1 restarts in "
                                        "60 s")
            assert m.state is State.FAILED
    finally:
        sup.stop_all(grace_s=1)


def test_nice_lowers_the_priority_of_the_process_and_its_children(sup: Supervisor,
                                                                  tmp_path: Path) -> None:
    m = sup.start(dataclasses.replace(spec(tmp_path), nice=5))
    run_until(sup, lambda ev: m.state is State.UP and len(tree(m)) == 2)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert [p.nice() for p in tree(m)] == [base + 5, base + 5]
    group = Path(f"/proc/{m.pid}/autogroup")
    if group.exists():  # Linux autogroup: the niceness must reach the session's group too
        assert group.read_text().split()[-1] == "5"


def test_engines_yield_the_cpu_to_a_restarting_one(tmp_path: Path) -> None:
    """While one process that yields restarts, the others that yield and are up get their
    ``yield_nice`` in their session's scheduling group, and their own niceness back once
    it is up (issue 35: a restarting engine starved by the one carrying the load)."""
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no Linux autogroup here")
    gate = tmp_path / "healthy"
    gate.touch()
    sup = Supervisor(tmp_path, health_timeout_s=60, max_restarts=1, backoff_s=0.1,
                     backoff_max_s=0.1)
    try:
        restarting, serving, router = (
            sup.start(dataclasses.replace(spec(tmp_path, f"gate={gate}", name), yield_nice=y))
            for name, y in (("a", 7), ("b", 7), ("router", 0)))

        def nice(m: Managed) -> str:
            return Path(f"/proc/{m.pid}/autogroup").read_text().split()[-1]

        run_until(sup, lambda ev: all(m.state is State.UP for m in sup.procs))
        assert [nice(m) for m in sup.procs] == ["0", "0", "0"]
        gate.unlink()  # the restart stays unhealthy until the test lets it up
        os.kill(restarting.pid, signal.SIGKILL)
        run_until(sup, lambda ev: restarting.state is State.STARTING
                  and restarting.restarts == 1)
        assert (nice(restarting), nice(serving), nice(router)) == ("0", "7", "0")
        gate.touch()
        run_until(sup, lambda ev: restarting.state is State.UP)
        assert [nice(m) for m in sup.procs] == ["0", "0", "0"]
    finally:
        sup.stop_all(grace_s=1)


def test_a_restarted_router_is_told_which_engines_are_not_serving(tmp_path: Path) -> None:
    """``launcher.run.not_serving``: the engines not up (restarting, given up on), never
    the routers, never one stopped (removed from routing)."""
    from launcher.run import not_serving

    sup = Supervisor(tmp_path, health_timeout_s=1, max_restarts=0, backoff_s=0.1,
                     backoff_max_s=0.1)
    spec = ProcessSpec(name="x", argv=["true"], env={}, log_path=tmp_path / "x.log",
                       health_url=None)
    procs = {state: Managed(dataclasses.replace(spec, name=state.value), state=state)
             for state in State}
    router = Managed(dataclasses.replace(spec, name="router"), state=State.STARTING)
    sup.procs = [*procs.values(), router]
    assert [m.spec.name for m in not_serving(sup, [router], None)] == [
        "starting", "down", "failed"]
