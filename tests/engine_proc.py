"""Start and stop real engine processes (``python -m engine_ext.serve``) for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

TINY_ENGINE_ARGS = [
    "--dtype", "float32", "--max-model-len", "1024", "--kv-cache-memory-bytes", "67108864",
    "--enforce-eager",
]
HEALTH_TIMEOUT_S = float(os.environ.get("HETSERVE_TEST_HEALTH_TIMEOUT", "300"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineProc:
    engine_id: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    telemetry_endpoint: str
    kv_events_endpoint: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def spawn_engine(tmp: Path, engine_id: str, model: str = "builtin:tiny-a",
                 extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> EngineProc:
    """Start an engine in its own process group; ``wait_engine`` waits until it serves."""
    port = free_port()
    tel = f"ipc://{tmp}/{engine_id}.telemetry"
    kv = f"ipc://{tmp}/{engine_id}.kv"
    log_path = tmp / f"{engine_id}.log"
    cmd = [sys.executable, "-m", "engine_ext.serve", "--model", model, "--engine-id", engine_id,
           "--telemetry-endpoint", tel, "--kv-events-endpoint", kv, "--port", str(port),
           *TINY_ENGINE_ARGS, *(extra or [])]
    env = {**os.environ, **(env or {}), "HF_HUB_OFFLINE": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    return EngineProc(engine_id, port, proc, log_path, tel, kv)


def wait_engine(engine: EngineProc) -> EngineProc:
    """``engine`` once /health answers; stopped, with its log's tail raised, if it exits or
    stays unhealthy for HEALTH_TIMEOUT_S."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if engine.proc.poll() is not None:
            raise RuntimeError(f"engine {engine.engine_id} exited:\n{engine.log_tail()}")
        try:
            if httpx.get(f"{engine.url}/health", timeout=2).status_code == 200:
                return engine
        except httpx.HTTPError:
            pass
        time.sleep(1)
    engine.stop()
    raise RuntimeError(f"engine {engine.engine_id} not healthy in {HEALTH_TIMEOUT_S}s:\n"
                       f"{engine.log_tail()}")


def start_engine(tmp: Path, engine_id: str, model: str = "builtin:tiny-a",
                 extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> EngineProc:
    """Start an engine in its own process group and wait until /health answers."""
    return wait_engine(spawn_engine(tmp, engine_id, model, extra, env))


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
