"""Start and stop real processes (engines, routers) for tests: the command lines are the
launcher's (tests/tiny_pair.py) or the router's own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

TINY_ENGINE_ARGS = [
    "--dtype", "float32", "--max-model-len", "1024", "--kv-cache-memory-bytes", "67108864",
    "--enforce-eager",
]
"""A tiny model's engine flags on CPU (tests/integration/test_stock_engine.py's stock engine,
still started by hand)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineProc:
    """An engine process a test reads from: its id, port, process, log and endpoints."""

    engine_id: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    telemetry_endpoint: str
    kv_events_endpoint: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


ROOT = Path(__file__).resolve().parents[1]


def spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``argv`` from the repository root in its own process group (``kill_group``), with
    ``env`` over this environment and HF_HUB_OFFLINE=1, its output appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
                                start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Until ``url``/health answers 200; the test fails with the log's tail if ``proc``
    exits or ``timeout_s`` passes first."""
    import pytest

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"{url} not healthy after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal ``proc``'s process group (SIGKILL after 30 s) and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
