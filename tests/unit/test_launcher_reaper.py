"""launcher.reaper: what its command leaves behind dies with it, and it ends as the
command did."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

GRANDCHILD = ("import subprocess, sys, os, signal, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(0.5); {end}")


def reap(tmp_path: Path, end: str) -> tuple[subprocess.Popen[bytes], int]:
    pid_file = tmp_path / "grandchild"
    proc = subprocess.Popen([sys.executable, "-m", "launcher.reaper", sys.executable, "-c",
                             GRANDCHILD.format(end=end), str(pid_file)],
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, int(pid_file.read_text())


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_command_killed_leaves_nothing_and_its_signal_is_passed_on(tmp_path: Path) -> None:
    proc, grandchild = reap(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.wait(30) == -signal.SIGKILL
    assert gone(grandchild)


def test_sigterm_stops_the_command_and_its_group(tmp_path: Path) -> None:
    proc, grandchild = reap(tmp_path, "time.sleep(120)")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    assert gone(grandchild)


def test_an_exit_code_is_kept(tmp_path: Path) -> None:
    proc, grandchild = reap(tmp_path, "sys.exit(3)")
    assert proc.wait(30) == 3
    assert gone(grandchild)
