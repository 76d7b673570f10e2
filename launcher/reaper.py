"""``python -m launcher.reaper CMD [ARG...]``: run CMD and take its whole process group
down with it.

A Ray host actor starts its engine through this (``launcher.backends.ray``), as the leader
of a new session: if the actor dies (its node is lost, the launcher's job ends) the reaper
gets SIGTERM (``PR_SET_PDEATHSIG``, set by ``launcher.process.spawn``), passes it to
the engine and, after a grace period, SIGKILLs every process left in its group. vLLM's
EngineCore and workers stay in that group but outlive a killed API server, which the
actor, being gone, can no longer clean up. The reaper exits as CMD did (the same code, or
the same signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType

import psutil

GRACE_S = 10.0
"""After SIGTERM, how long CMD has to stop before the group is killed."""


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m launcher.reaper CMD [ARG...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv)  # in this process's group
    deadline: list[float] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if not deadline:
            deadline.append(time.monotonic() + GRACE_S)
            child.send_signal(signal.SIGTERM)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)
    while child.poll() is None and (not deadline or time.monotonic() < deadline[0]):
        time.sleep(0.1)
    _kill_group()
    code = child.wait()
    if code < 0:  # end as CMD did: by the same signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those have no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _kill_group() -> None:
    """SIGKILL every other process of this process group."""
    me, group = os.getpid(), os.getpgrp()
    for p in psutil.process_iter():
        try:
            if p.pid != me and os.getpgid(p.pid) == group:
                p.kill()
        except (psutil.Error, OSError):
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
