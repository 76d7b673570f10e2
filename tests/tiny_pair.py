"""Two real engines, ``a-0`` (``tiny-a``) and ``b-0`` (``tiny-b``, which requires an API key),
shared by the modules (integration and lab) that put a router in front of them (fixture
``tiny_pair`` in tests/conftest.py): one start of the pair for the session
instead of one per module. A module that kills an engine leaves it dead; the next module
to ask for the pair gets it started again (``TinyPair.revive``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.engine_proc import free_port, kill_group, spawn, wait_healthy

ENGINE_HEALTH_TIMEOUT_S = 240.0
"""Two engines starting together on 2 shared cores take about 40 s; leave room."""
MAX_MODEL_LEN = 1024
ENGINES = {"a": ("tiny-a", "0"), "b": ("tiny-b", "1")}
"""Engine name -> (served model, CPU core)."""
ENGINE_KEY = ("HS_TEST_ENGINE_KEY", "hs-test-engine-key")
"""Engine ``b`` requires this API key (vLLM's VLLM_API_KEY); a router sends it from this
variable (``api_key_env``), so every test that reaches ``b`` also tests that."""


@dataclass
class TinyPair:
    d: Path
    """Short folder (ipc:// and unix socket paths are limited) of the engines' sockets and
    logs; routers in front of the pair may put their own files here."""
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def engines_toml(self) -> str:
        """``[[engines]]`` tables of the pair for a router's cluster file."""
        lines = []
        for name, (model, _) in ENGINES.items():
            lines += ["[[engines]]", f'name = "{name}"', f'served_model_name = "{model}"',
                      f'model = "builtin:{model}"', f"port = {self.ports[name]}",
                      f'telemetry_endpoint = "ipc://{self.d}/{name}-0.telemetry"',
                      f'kv_events_endpoint = "ipc://{self.d}/{name}-0.kv"',
                      f"max_model_len = {MAX_MODEL_LEN}"]
            lines += [f'api_key_env = "{ENGINE_KEY[0]}"', ""] if name == "b" else [""]
        return "\n".join(lines)

    def revive(self) -> None:
        """Start every engine that is not running (all of them at first), then wait until
        each serves."""
        for name, (model, core) in ENGINES.items():
            if name in self.procs and self.procs[name].poll() is None:
                continue
            self.procs[name] = spawn([
                sys.executable, "-m", "engine_ext.serve", "--model", f"builtin:{model}",
                "--engine-id", f"{name}-0", "--served-model-name", model,
                "--telemetry-endpoint", f"ipc://{self.d}/{name}-0.telemetry",
                "--kv-events-endpoint", f"ipc://{self.d}/{name}-0.kv",
                "--host", "127.0.0.1", "--port", str(self.ports[name]), "--dtype", "float32",
                "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
                "--enable-prompt-tokens-details",
                "--kv-cache-memory-bytes", str(64 * 2**20), "--enforce-eager",
            ], self.d / f"{name}.log", {"VLLM_CPU_OMP_THREADS_BIND": core,
                                        **({"VLLM_API_KEY": ENGINE_KEY[1]} if name == "b" else {})})
        for name, proc in self.procs.items():
            wait_healthy(self.url(name), proc, self.d / f"{name}.log", ENGINE_HEALTH_TIMEOUT_S)

    def stop(self) -> None:
        for proc in self.procs.values():
            kill_group(proc)
        shutil.rmtree(self.d, ignore_errors=True)


def new_pair() -> TinyPair:
    """A pair not yet started (``revive`` starts it)."""
    return TinyPair(Path(tempfile.mkdtemp(prefix="hs-pair-", dir="/tmp")),
                    {name: free_port() for name in ENGINES})
