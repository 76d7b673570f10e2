"""Run untrusted generated code in a separate, network-less, time-limited process.

The program runs in ``python -I`` (isolated: no user site, no ``PYTHON*`` variables) in a
fresh temporary folder, in its own process group (killed whole on timeout), with resource
limits (address space, CPU seconds, file size, open files). Network: inside a new network
namespace (``unshare -n``, which has no usable interface) when the machine allows it, and
in every case with Python's socket constructors replaced by ones that raise. It never runs
in the caller's process, but it runs as the caller's user, with that user's access to files
(dropping to another user would lose the Python installation when only the caller may read
it): do not build traces as root from models you do not trust.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

Status = Literal["passed", "failed", "timeout"]

_BOOTSTRAP = r"""
import resource, socket, sys
mem, cpu = int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 24, 1 << 24))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the sandbox")
class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        _no_network()
socket.socket = _NoSocket
for _name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
    setattr(socket, _name, _no_network)
path = sys.argv[1]
sys.argv = [path]
with open(path) as f:
    code = compile(f.read(), path, "exec")
exec(code, {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class SandboxResult:
    status: Status
    detail: str
    """The last lines of the program's stderr (failure) or the timeout."""
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.cache
def network_isolation() -> tuple[str, ...]:
    """The command prefix that runs a process in a new network namespace (``unshare -n``,
    or ``unshare -rn`` through a user namespace); empty if this machine allows neither."""
    if shutil.which("unshare"):
        for prefix in (("unshare", "-n"), ("unshare", "-rn")):
            if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
                return prefix
    return ()


def run_program(program: str, timeout_s: float = 10.0, memory_bytes: int = 1 << 30,
                python: str = sys.executable) -> SandboxResult:
    """Run ``program`` (Python source); passed means exit code 0 within ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="hetserve-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(program)
        argv = [*network_isolation(), python, "-I", "-c", _BOOTSTRAP, path,
                str(memory_bytes), str(int(timeout_s) + 1)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8"}
        t0 = time.monotonic()
        # stderr goes to a file the program's RLIMIT_FSIZE bounds (a pipe would not be).
        with open(os.path.join(tmp, "stderr"), "w+b") as err:
            proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return SandboxResult("timeout", f"timed out after {timeout_s:g} s",
                                     time.monotonic() - t0)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # and anything it started
                proc.wait()
            took = time.monotonic() - t0
            err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
            tail_bytes = err.read()
    if proc.returncode == 0:
        return SandboxResult("passed", "", took)
    tail = "\n".join(tail_bytes.decode(errors="replace").strip().splitlines()[-5:])
    return SandboxResult("failed", tail or f"exit code {proc.returncode}", took)


def humaneval_program(problem: dict[str, str], code: str) -> str:
    """The test program of a HumanEval problem for a proposed solution: the problem's
    prompt (its imports and helpers), the solution (which redefines the entry point), the
    tests and the call of ``check``."""
    return (f"{problem['prompt']}\n    pass\n\n{code}\n\n{problem['test']}\n\n"
            f"check({problem['entry_point']})\n")
