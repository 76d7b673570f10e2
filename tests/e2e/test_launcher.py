"""The launcher for real: the demo cluster of examples/demo.toml on CPU.

Each test starts ``python -m launcher examples/demo.toml`` (two real engines, about a
minute to become healthy here) and checks the process tree with psutil. Tests that need
the router run once ``python -m router`` exists.

    .venv/bin/python -m pytest tests/e2e/test_launcher.py -m engine -v
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from launcher.process import MARKER_ENV
from launcher.settings import LaunchConfig, load_launch_config
from router.config.cluster import load_cluster_config

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.toml"
START_TIMEOUT_S = 900.0
"""Two engines on two shared cores: about a minute alone, much more when contended."""


class Launcher:
    """``python -m launcher examples/demo.toml ARGS`` with its output in a file."""

    def __init__(self, tmp_path: Path, *args: str, config: Path = DEMO) -> None:
        self.config = config
        self.run_dir = tmp_path / "run"
        self.out_path = tmp_path / "launcher.out"
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "launcher", str(config), "--run-dir",
                 str(self.run_dir), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, what: str, ready: Callable[[], bool],
                 timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if self.proc.poll() is not None:
                pytest.fail(f"launcher exited ({self.proc.returncode}) while waiting for "
                            f"{what}:\n{self.output()}")
            time.sleep(0.5)
        pytest.fail(f"timed out waiting for {what}:\n{self.output()}")

    def wait_up(self) -> LaunchConfig:
        """Wait for the launcher's table (everything it starts is healthy)."""
        self.wait_for("the cluster",
                      lambda: re.search(r"^ENGINE +KIND +MODEL", self.output(), re.M) is not None)
        return load_launch_config(self.run_dir / "cluster.resolved.toml")

    def engine_process(self, instance: str) -> psutil.Process | None:
        for child in psutil.Process(self.proc.pid).children():
            cmd = child.cmdline()
            if "--engine-id" in cmd and cmd[cmd.index("--engine-id") + 1] == instance:
                return child
        return None

    def cluster(self) -> list[psutil.Process]:
        """Every process of the cluster: the launcher's tree and anything carrying the
        run directory marker in its environment."""
        procs = {p.pid: p for p in psutil.Process(self.proc.pid).children(recursive=True)}
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER_ENV) == str(self.run_dir):
                    procs[p.pid] = p
            except psutil.Error:
                continue
        return list(procs.values())

    def close(self) -> None:
        """Test cleanup: stop the launcher if a test left it running, and any leftover."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in _marked(self.run_dir):
            p.kill()


def _marked(run_dir: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER_ENV) == str(run_dir) and _alive(p):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def launcher_factory(tmp_path: Path) -> Iterator[Callable[..., Launcher]]:
    started: list[Launcher] = []

    def start(*args: str, config: Path = DEMO) -> Launcher:
        started.append(Launcher(tmp_path, *args, config=config))
        return started[-1]

    yield start
    for la in started:
        la.close()


def kill_engine_and_wait_restart(la: Launcher, cfg: LaunchConfig, instance: str,
                                 while_down: Callable[[], None]) -> None:
    """SIGKILL an engine's server while another program takes its port: it must be
    restarted on another port, healthy, without the killed server's EngineCore."""
    url = next(i.url for i in cfg.instances() if i.name == instance)
    victim = la.engine_process(instance)
    assert victim is not None, la.output()
    workers = victim.children(recursive=True)  # EngineCore and its worker
    assert workers, "the engine server has no EngineCore process"
    victim.send_signal(signal.SIGKILL)
    la.wait_for(f"{instance} to be marked down",
                lambda: f"{instance} killed by SIGKILL; restart 1 of" in la.output(),
                timeout=30)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
    # before the restart (1 s backoff): the launcher must see the port taken
    squatter.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    squatter.listen()
    try:
        while_down()
        la.wait_for(f"{instance} to come back",
                    lambda: f"{instance} is up again (restart 1)" in la.output())
    finally:
        squatter.close()
    moved = re.search(rf"{instance} port \d+ is taken; restarting on port (\d+)", la.output())
    assert moved is not None, la.output()
    url = f"{url.rsplit(':', 1)[0]}:{moved.group(1)}"
    resolved = load_cluster_config(la.run_dir / "cluster.resolved.toml")
    assert next(i.url for i in resolved.instances() if i.name == instance) == url
    assert healthy(url)
    assert not [p for p in workers if _alive(p)], "the killed server's EngineCore survived"
    restarted = la.engine_process(instance)
    assert restarted is not None and restarted.pid != victim.pid


def sigterm_leaves_nothing(la: Launcher, cfg: LaunchConfig) -> None:
    """SIGTERM to the launcher: every process of the cluster is gone within the grace
    period (plus a little for SIGKILL and reaping), and the launcher exits 0."""
    procs = la.cluster()
    assert len(procs) >= 2 * len([i for i in cfg.instances() if not i.remote])
    t0 = time.monotonic()
    la.proc.send_signal(signal.SIGTERM)
    assert la.proc.wait(cfg.launcher.grace_period_s + 15) == 0, la.output()
    deadline = t0 + cfg.launcher.grace_period_s + 5
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [p for p in procs if _alive(p)] + _marked(la.run_dir)
    assert not survivors, [(p.pid, p.cmdline()) for p in survivors]
    assert "stopped" in la.output().splitlines()[-1]


def metric(url: str, name: str) -> float:
    """One sample of the router process at ``url``'s ``/metrics``."""
    text = httpx.get(url + "/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found is not None, f"{name} not in {url}/metrics"
    return float(found.group(1))


def telemetry_only_with_keys(cfg: LaunchConfig) -> None:
    """CURVE (``telemetry_keys_dir``): every router worker hears every engine's snapshots;
    a subscriber without the keys hears nothing on the same endpoint."""
    import zmq
    from prometheus_client.parser import text_string_to_metric_families

    def frames(port: int, stream: str) -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return {s.labels["engine"]: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "hetserve_telemetry_frames_total"
                and s.labels["stream"] == stream}

    for inst in cfg.instances():  # a prompt of two 128-token blocks: vLLM's KV events
        httpx.post(inst.url + "/v1/completions", timeout=120, json={
            "model": inst.served_model_name, "prompt": list(range(5, 261)), "max_tokens": 1})
    for port in cfg.router.worker_ports or []:
        deadline = time.monotonic() + 20  # heartbeats every 0.5 s while idle
        while (min(frames(port, "snapshot").values()) < 3
               or min(frames(port, "kv").values()) < 1) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert min(frames(port, "snapshot").values()) >= 3, frames(port, "snapshot")
        assert min(frames(port, "kv").values()) >= 1, frames(port, "kv")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(cfg.instances()[0].telemetry_endpoint)
    try:
        assert not sock.poll(3000)  # heartbeats go out every 0.5 s, none to us
    finally:
        sock.close(0)
        ctx.term()


def programs_follow_across_workers(cfg: LaunchConfig) -> None:
    """A program's first stage through worker 0's own port, the next through worker 1's:
    worker 1 has the program in its table before the call (sent by worker 0) and routes
    the stage to the model the first one got; the final stage clears both tables."""
    assert cfg.router.worker_ports is not None
    w0, w1 = (f"http://127.0.0.1:{p}" for p in cfg.router.worker_ports)

    def stage(url: str, index: int) -> str:
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "workflow": {"program_id": "p-1", "stage_index": index, "num_stages": 2,
                         "final": index == 1}})
        assert r.status_code == 200, r.text
        return r.headers["x-hetserve-model"]

    # the programs each worker started for calls that named none (local, never shared)
    held = {w: metric(w, "hetserve_programs") for w in (w0, w1)}
    first = stage(w0, 0)
    deadline = time.monotonic() + 10
    while metric(w1, "hetserve_programs") < held[w1] + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(w1, "hetserve_programs") == held[w1] + 1
    assert metric(w1, 'hetserve_peer_events_total{outcome="applied"}') >= 1
    assert stage(w1, 1) == first
    deadline = time.monotonic() + 10
    while metric(w0, "hetserve_programs") > held[w0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(w0, "hetserve_programs") == held[w0]
    assert metric(w1, "hetserve_programs") == held[w1]


def readme_request(base_url: str) -> None:
    """README.md's "Keep it running", as a new user follows it: its launcher command is the
    one these tests run, and its openai snippet, run as written but for the router's port
    (8100 unless taken), gets an answer from one of the demo's models."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(
        "## Keep it running", 1)[1].split("\n## ", 1)[0]
    assert "python -m launcher examples/demo.toml" in section
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None and "http://127.0.0.1:8100/v1" in snippet.group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet.group(1).replace("http://127.0.0.1:8100/v1", base_url),
                     "README.md", "exec"), {"__name__": "__readme__"})
    assert out.getvalue().split()[0] in ("tiny-a", "tiny-b"), out.getvalue()


def test_demo_cluster(launcher_factory: Callable[..., Launcher], tmp_path: Path) -> None:
    """The demo cluster (its client runs in ``test_demo_flag``), with two router processes
    on one port (``workers = 2``) and CURVE on the telemetry plane: telemetry reaches both
    workers and no one without the keys; a program's stages follow its model across the
    workers; each engine has its own core and runs offline; an engine killed is marked
    down, requests succeed on the other one, it comes back on another port (its own was
    taken meanwhile) and both workers follow it; SIGTERM stops every process."""
    from engine_ext.curve import create

    create(tmp_path / "curve")
    config = tmp_path / "demo-workers.toml"
    config.write_text(DEMO.read_text().replace(
        '[router]\n', '[router]\nworkers = 2\ntelemetry_keys_dir = "curve"\n', 1))
    la = launcher_factory(config=config)
    cfg = la.wait_up()
    assert cfg.router.workers == 2
    base_url = cfg.router_url() + "/v1"
    assert all(healthy(i.url) for i in cfg.instances()) and healthy(cfg.router_url())
    assert all(healthy(f"http://127.0.0.1:{p}") for p in cfg.router.worker_ports or [])
    readme_request(base_url)
    servers = [la.engine_process(i.name) for i in cfg.instances()]
    assert None not in servers
    envs = [p.environ() for p in servers if p is not None]
    assert all(env["HF_HUB_OFFLINE"] == "1" for env in envs)
    assert {env["VLLM_CPU_OMP_THREADS_BIND"] for env in envs} == {"0", "1"}  # a core each
    telemetry_only_with_keys(cfg)
    programs_follow_across_workers(cfg)

    def served_by_the_other() -> None:
        import openai

        c = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        for _ in range(3):
            raw = c.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "hello"}],
                max_tokens=8)
            assert raw.parse().choices[0].message is not None
            assert raw.headers.get("x-hetserve-engine") == "tiny-b-0"

    kill_engine_and_wait_restart(la, cfg, "tiny-a-0", while_down=served_by_the_other)
    log = (la.run_dir / "launcher.log").read_text()
    assert f"POST {cfg.router_url()}/admin/engines/tiny-a-0/down: 200" in log
    assert f"POST {cfg.router_url()}/admin/engines/tiny-a-0/move: 200" in log
    assert f"POST {cfg.router_url()}/admin/engines/tiny-a-0/up: 200" in log
    import openai  # both workers route tiny-a to its new port (one was told, one heard)

    c = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    for _ in range(6):
        raw = c.chat.completions.with_raw_response.create(
            model="tiny-a", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        assert raw.headers.get("x-hetserve-engine") == "tiny-a-0"
    sigterm_leaves_nothing(la, cfg)


def test_demo_flag(launcher_factory: Callable[..., Launcher]) -> None:
    """``--demo`` (what ``make demo`` runs): up, client workflow, down, exit 0."""
    la = launcher_factory("--demo")
    assert la.proc.wait(START_TIMEOUT_S + 600) == 0, la.output()
    out = la.output()
    assert out.count("  stage ") == 9 and "stages per model: " in out
    assert not _marked(la.run_dir)
