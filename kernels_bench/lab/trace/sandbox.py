"""Run untrusted generated code in a separate, isolated, time-limited process.

The program runs in ``python -I`` (isolated: no user site, no ``PYTHON*`` variables) in a
fresh temporary folder with resource limits (address space, CPU seconds, file size, open
files, processes) and Python's socket constructors replaced by ones that raise. Around it,
as far as the machine allows (``isolation()`` says which layers apply):

- ``full`` (as root, with util-linux's ``unshare`` and ``setpriv``): new network, PID and
  mount namespaces. Every mount is read-only except the program's folder, a directory
  the program's user could not enter (the caller's home, e.g. ``/root``) is replaced by an
  empty view holding only the Python installation, and the program runs as a user id of
  its own (no other process has it), so ``RLIMIT_NPROC`` bounds its processes and it can
  signal no one else. The program's PID namespace dies with it: at the timeout, or when
  it exits, every process it started (``setsid`` and double forks included) is killed.
- ``pid+net`` (an unprivileged caller where user namespaces are allowed): new user,
  network and PID namespaces; the whole namespace is killed as above, but the program
  runs with the caller's file access.
- ``net`` / ``none``: network namespace only (``unshare -n``), or nothing beyond the
  process group, which is killed at the timeout.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import functools
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["passed", "failed", "timeout"]
Isolation = Literal["full", "pid+net", "net", "none"]

MAX_PROCESSES = 32
"""RLIMIT_NPROC of a program (threads count too) under ``full`` isolation."""
_UID_RANGE = (3_000_000, 3_900_000)
"""User ids a program may run as under ``full`` isolation: far above any real account."""

_BOOTSTRAP = r"""
import resource, socket, sys
mem, cpu, nproc = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
if nproc:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
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


# Runs as PID 1 of the program's namespaces, as root there: builds the read-only view,
# then starts the program as its own user and waits for it (its exit ends the namespace).
_SETUP = r"""
set -eu
scratch=$1 prefix=$2 hidden=$3 uid=$4
shift 4
mount --make-rprivate /
mount --bind "$scratch" "$scratch"
if [ -n "$hidden" ]; then
    mkdir "$scratch/.prefix"
    mount --bind "$prefix" "$scratch/.prefix"
    mount -t tmpfs -o mode=755,size=1m hetserve-sandbox "$hidden"
    mkdir -p "$prefix"
    mount --move "$scratch/.prefix" "$prefix"
    rmdir "$scratch/.prefix"
fi
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do
    mount -o remount,bind,ro "$m" 2>/dev/null || true
done
mount -o remount,bind,rw "$scratch"
cd "$scratch"  # the writable mount, not the folder under it
setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs --inh-caps=-all \
    --bounding-set=-all -- "$@"
"""

_NAMESPACES = ("unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def isolation() -> Isolation:
    """The strongest isolation this machine allows (see the module docstring)."""
    if not shutil.which("unshare"):
        return "none"
    if os.geteuid() == 0 and shutil.which("setpriv") and _works(
            [*_NAMESPACES, "--mount", "sh", "-c", "mount -t tmpfs none /mnt && "
             "setpriv --reuid=3000000 --regid=3000000 --clear-groups true"]):
        return "full"
    if _works([*_NAMESPACES, "--map-root-user", "true"]):
        return "pid+net"
    if _works(["unshare", "--net", "true"]):
        return "net"
    return "none"


def _hidden_ancestor(path: str) -> str:
    """The outermost ancestor of ``path`` that other users cannot enter ("" if none)."""
    parts = Path(path).resolve().parts
    for i in range(2, len(parts)):
        ancestor = os.path.join(*parts[:i])
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor
    return ""


def _command(tmp: str, program: str, python: str, memory_bytes: int, cpu_s: int,
             level: Isolation) -> list[str]:
    """The argv running ``program`` under ``level``; prepares ``tmp`` for it."""
    nproc = MAX_PROCESSES if level == "full" else 0
    run = [python, "-I", "-c", _BOOTSTRAP, program, str(memory_bytes), str(cpu_s), str(nproc)]
    if level == "full":
        uid = _UID_RANGE[0] + secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0])
        os.chown(tmp, uid, uid)
        os.chmod(tmp, 0o700)
        prefix = os.path.realpath(sys.base_prefix)
        return [*_NAMESPACES, "--mount", "sh", "-c", _SETUP, "sandbox", tmp, prefix,
                _hidden_ancestor(prefix), str(uid), *run]
    prefixes: dict[Isolation, tuple[str, ...]] = {
        "pid+net": (*_NAMESPACES, "--map-root-user"), "net": ("unshare", "--net"),
        "none": ()}
    return [*prefixes[level], *run]


def run_program(program: str, timeout_s: float = 10.0, memory_bytes: int = 1 << 30,
                python: str = sys.executable) -> SandboxResult:
    """Run ``program`` (Python source); passed means exit code 0 within ``timeout_s``."""
    level = isolation()
    if level == "full":  # the program's user must be able to run the interpreter
        python = os.path.join(os.path.realpath(sys.base_prefix), "bin",
                              os.path.basename(os.path.realpath(python)))
    with tempfile.TemporaryDirectory(prefix="hetserve-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(program)
        os.chmod(path, 0o644)
        argv = _command(tmp, path, python, memory_bytes, int(timeout_s) + 1, level)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8"}
        t0 = time.monotonic()
        # stderr goes to a file the program's RLIMIT_FSIZE bounds (a pipe would not be);
        # the caller opens it, so the program needs no right to the file itself.
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
                # the process group, and with it the PID namespace and all it started
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            took = time.monotonic() - t0
            err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
            tail_bytes = err.read()
    if proc.returncode == 0:
        return SandboxResult("passed", "", took)
    tail = "\n".join(tail_bytes.decode(errors="replace").strip().splitlines()[-5:])
    return SandboxResult("failed", tail or f"exit code {proc.returncode}", took)


def _with_solution(problem: dict[str, str], code: str = "") -> str:
    """A HumanEval problem's prompt (its imports and helpers, the entry point's signature
    and docstring) made valid Python by a ``pass`` body, then ``code``, which redefines
    the entry point."""
    return f"{problem['prompt']}\n    pass\n\n{code}"


def prompt_examples(problem: dict[str, str]) -> str | None:
    """The docstring of a HumanEval problem's entry point when it holds doctest examples
    that parse (``>>> call`` then the expected output); None otherwise (about a third of
    the problems state their examples in prose)."""
    try:
        tree = ast.parse(_with_solution(problem))
    except SyntaxError:
        return None
    doc = next((ast.get_docstring(n) or "" for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"]), "")
    try:
        return doc if doctest.DocTestParser().get_examples(doc) else None
    except ValueError:  # malformed example (inconsistent indentation)
        return None


def examples_program(problem: dict[str, str], code: str, examples: str) -> str:
    """The program that runs a proposed solution on ``examples`` (``prompt_examples``):
    exit code 0 when every example gives its stated output (whitespace normalised). It
    reads only the prompt, never the problem's hidden tests."""
    return (f"{_with_solution(problem, code)}\n\nimport doctest as _d, sys as _s\n"
            f"_t = _d.DocTestParser().get_doctest({examples!r}, globals(), 'examples', None, 0)\n"
            f"_r = _d.DocTestRunner(optionflags=_d.NORMALIZE_WHITESPACE).run(\n"
            f"    _t, out=lambda _: None)\n"
            f"_s.exit(1 if _r.failed else 0)\n")


def humaneval_program(problem: dict[str, str], code: str) -> str:
    """The test program of a HumanEval problem for a proposed solution: the prompt and the
    solution (``_with_solution``), the tests and the call of ``check``."""
    return (f"{_with_solution(problem, code)}\n\n{problem['test']}\n\n"
            f"check({problem['entry_point']})\n")


def value_program(code: str, entry_point: str, expected: float) -> str:
    """The program that calls ``entry_point()`` (no arguments) of ``code`` and exits 0
    when it returns a number equal to ``expected`` (relative tolerance 1e-6, as
    ``answers.numbers_equal``): a math agent's check of a worked answer by a program."""
    if not math.isfinite(expected):
        raise ValueError(f"expected must be a finite number, got {expected!r}")
    return (f"{code}\n\nimport numbers as _n, sys as _s\n"
            f"_v = {entry_point}()\n"
            f"_ok = isinstance(_v, _n.Real) and not isinstance(_v, bool) and "
            f"abs(float(_v) - {expected!r}) <= 1e-6 * max(1.0, abs({expected!r}))\n"
            f"_s.exit(0 if _ok else 1)\n")
