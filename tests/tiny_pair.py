"""Two real engines, ``a-0`` (``tiny-a``) and ``b-0`` (``tiny-b``, which requires an API key),
shared by the modules (integration and lab) that put a router in front of them (fixture
``tiny_pair`` in tests/conftest.py): one start of the pair for the session instead of one
per module. Their command lines and environments are the launcher's own
(``launcher.planner.make_plan`` with ``--only a --only b`` on the cluster file
``cluster_file``; ``plan_engines``, which tests/integration/test_engine.py's engines use
too), so the tests run exactly what ``python -m launcher`` would. A module that kills an
engine leaves it dead; the next module to ask for the pair gets it started again
(``TinyPair.revive``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from launcher.devices import Devices
from launcher.plan import Plan
from launcher.planner import make_plan
from launcher.settings import load_launch_config
from router.config.engines import EngineInstance
from tests.engine_proc import free_port, kill_group, spawn, wait_healthy

ENGINE_HEALTH_TIMEOUT_S = 240.0
"""Two engines starting together on 2 shared cores take about 40 s; leave room."""
MAX_MODEL_LEN = 1024
ENGINES = {"a": "tiny-a", "b": "tiny-b"}
"""Engine name -> served model."""
ENGINE_KEY = ("HS_TEST_ENGINE_KEY", "hs-test-engine-key")
"""Engine ``b`` requires this API key (vLLM's VLLM_API_KEY); a router sends it from this
variable (``api_key_env``), so every test that reaches ``b`` also tests that."""
TINY = {"max_model_len": MAX_MODEL_LEN, "dtype": "float32", "enforce_eager": True,
        "kv_cache_bytes": 64 * 2**20}
"""Every engine's settings of a tiny model on CPU."""


def cluster_file(ports: dict[str, int]) -> dict[str, object]:
    """The pair's cluster file: what an operator would write for it."""
    return {"router": {"policy": "round_robin"}, "engines": [{
        "name": name, "model": f"builtin:{model}", "served_model_name": model,
        "port": ports[name], "max_num_seqs": 8, **TINY,
        "extra_args": ["--enable-prompt-tokens-details",  # tool calls: vLLM's parser
                       "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        "env": {"VLLM_ENABLE_RESPONSES_API_STORE": "1"},  # previous_response_id chains
        **({"api_key_env": ENGINE_KEY[0]} if name == "b" else {})}
        for name, model in ENGINES.items()]}


@dataclass
class TinyPair:
    """Engines of a cluster file the launcher planned (the pair, or a module's own),
    started by this process."""

    d: Path
    """Short folder (ipc:// and unix socket paths are limited) of the engines' sockets and
    logs; routers in front of the engines may put their own files here."""
    plan: Plan
    """The launcher's plan of the engines (no router)."""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def instance(self, name: str) -> EngineInstance:
        """Engine ``name``'s one replica (``a-0``, ``b-0``) as the plan resolved it."""
        return next(i for i in self.plan.config.instances() if i.engine == name)

    @property
    def names(self) -> list[str]:
        """The planned engines' entry names."""
        return [e.name for e in self.plan.config.engines]

    @property
    def ports(self) -> dict[str, int]:
        return {name: self.instance(name).port for name in self.names}

    def url(self, name: str) -> str:
        return self.instance(name).url

    def log(self, name: str) -> Path:
        return self.d / f"{self.instance(name).name}.log"

    def engines_toml(self) -> str:
        """``[[engines]]`` tables of the pair for a router's cluster file: the plan's
        resolved entries (ports, telemetry and KV-event endpoints filled in)."""
        entries = [{k: v for k, v in {
            "name": i.engine, "model": i.model, "served_model_name": i.served_model_name,
            "port": i.port, "telemetry_endpoint": i.telemetry_endpoint,
            "kv_events_endpoint": i.kv_events_endpoint, "max_model_len": i.max_model_len,
            "api_key_env": i.api_key_env}.items() if v is not None}
            for i in self.plan.config.instances()]
        return tomli_w.dumps({"engines": entries})

    def revive(self, wait: bool = True) -> None:
        """Start every engine that is not running (all of them at first), then (``wait``)
        wait until each serves."""
        for name, p in zip(self.names, self.plan.engines, strict=True):
            if name in self.procs and self.procs[name].poll() is None:
                continue
            self.procs[name] = spawn(p.spec.argv, p.spec.log_path, p.spec.env)
        for name, proc in self.procs.items() if wait else ():
            wait_healthy(self.url(name), proc, self.log(name), ENGINE_HEALTH_TIMEOUT_S)

    def stop(self) -> None:
        for proc in self.procs.values():
            kill_group(proc)
        shutil.rmtree(self.d, ignore_errors=True)


def plan_engines(file: Path, run_dir: Path, names: list[str], cpus: list[int]) -> TinyPair:
    """Engines ``names`` of the cluster file ``file``, not yet started (``revive`` starts
    them): planned by the launcher on CPU cores ``cpus`` in ``run_dir`` (made here)."""
    run_dir.mkdir(exist_ok=True)
    plan = make_plan(load_launch_config(file), Devices(gpus=[], cpus=cpus), run_dir,
                     only=names)
    return TinyPair(run_dir, plan)


def new_pair() -> TinyPair:
    """A pair not yet started: its engines on CPU cores 0 and 1, their API key in this
    process's environment."""
    d = Path(tempfile.mkdtemp(prefix="hs-pair-", dir="/tmp"))
    os.environ.setdefault(*ENGINE_KEY)
    (d / "cluster.toml").write_text(tomli_w.dumps(cluster_file(
        {name: free_port() for name in ENGINES})))
    return plan_engines(d / "cluster.toml", d, list(ENGINES), [0, 1])
