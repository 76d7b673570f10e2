"""The launcher on a real multi-node Ray cluster (``[cluster] backend = "ray"``).

A Ray cluster of three nodes is made on this machine (``ray.cluster_utils.Cluster``, all
on loopback): ``head`` offers ``node-a``, ``n2`` offers ``node-b`` and ``spare``, ``n3``
offers ``spare``. Engine ``a`` (built-in tiny model) needs ``node-a``, engine ``b`` needs
``spare``. One launcher runs for the module; the tests go in order: both engines serve
through the router from different nodes; at once, ``a``'s engine process killed comes
back and the node of ``b`` removed, ``b`` comes back on the other ``spare`` node and the
router follows it; a replica added and drained under load loses no request; SIGTERM
leaves no actor, placement group or process behind.

    .venv/bin/python -m pytest tests/e2e/test_launcher_ray.py -v
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from launcher.process import MARKER_ENV
from router.config.cluster import load_cluster_config
from tests.e2e.test_launcher import START_TIMEOUT_S, Launcher

ray = pytest.importorskip("ray", reason="the Ray extra (pip install -e '.[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.engine

@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"node-a": 1}, "node_ip_address": "127.0.0.1",
        "include_dashboard": False})
    c.add_node(num_cpus=2, resources={"node-b": 1, "spare": 2},
               node_ip_address="127.0.0.1")
    c.add_node(num_cpus=2, resources={"spare": 2}, node_ip_address="127.0.0.1")
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def launched(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    tmp = tmp_path_factory.mktemp("ray")
    config = tmp / "cluster.toml"
    engine = textwrap.dedent("""\
        [[engines]]
        name = "{name}"
        model = "builtin:tiny-{name}"
        resources = {{ "{resource}" = 1 }}
        enforce_eager = true
        max_model_len = 512
        nice = 10
    """)
    config.write_text(
        '[router]\npolicy = "round_robin"\n\n'
        f'[cluster]\nbackend = "ray"\naddress = "{cluster.address}"\n'
        "placement_timeout_s = 60\n\n"
        "[launcher]\nbase_port = 8700\nrestart_backoff_s = 0.5\n\n"
        + engine.format(name="a", resource="node-a") + "\n"
        + engine.format(name="b", resource="spare"))
    la = Launcher(tmp, config=config)
    la.wait_up()
    try:
        yield la
    finally:
        if la.proc.poll() is None:
            la.proc.kill()
            la.proc.wait()


def router_url(la: Launcher) -> str:
    return load_cluster_config(la.run_dir / "cluster.resolved.toml").router_url()


def health(la: Launcher) -> dict[str, dict[str, Any]]:
    body = httpx.get(router_url(la) + "/health", timeout=10).json()
    return {e["name"]: e for e in body["instances"]}


def ask(la: Launcher, model: str) -> httpx.Response:
    return httpx.post(router_url(la) + "/v1/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "hello"}]})


def wait(la: Launcher, what: str, ready: Any) -> None:
    def check() -> bool:
        try:
            return bool(ready())
        except httpx.HTTPError:
            return False
    la.wait_for(what, check, timeout=START_TIMEOUT_S)


def engine_pid(la: Launcher, instance: str) -> int | None:
    """The engine server of ``instance`` (a child of a Ray actor, not of the launcher)."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[1:3] == ["-m", "engine_ext.serve"] and \
                cmd[cmd.index("--engine-id") + 1] == instance:  # not its launcher.reaper
            return p.pid
    return None


def test_engines_on_two_nodes_serve_through_the_router(launched: Launcher) -> None:
    engines = health(launched)
    assert engines["a-0"]["up"] and engines["b-0"]["up"]
    assert engines["a-0"]["node"] != engines["b-0"]["node"], engines
    for model, instance in (("a", "a-0"), ("b", "b-0")):
        r = ask(launched, model)
        assert r.status_code == 200, r.text
        assert r.headers["x-hetserve-engine"] == instance
    metrics = httpx.get(router_url(launched) + "/metrics", timeout=10).text
    assert f'node="{engines["b-0"]["node"]}"' in metrics
    table = launched.output()
    assert "NODE" in table and engines["a-0"]["node"] in table


def test_a_killed_engine_and_a_lost_node_are_both_replaced(launched: Launcher,
                                                           cluster: Cluster) -> None:
    """Two faults at once (the two restarts overlap, one engine start's time): ``a-0``'s
    process killed comes back on its node; ``b-0``'s node removed, ``b-0`` comes back on
    the other ``spare`` node and the router follows it."""
    pid = engine_pid(launched, "a-0")
    assert pid is not None
    before = health(launched)["b-0"]["node"]
    node = next(n for n in cluster.list_all_nodes() if n.node_id[:8] in before)
    assert not node.head
    os.kill(pid, signal.SIGKILL)
    cluster.remove_node(node)
    wait(launched, "a-0 restarted", lambda: engine_pid(launched, "a-0") not in (None, pid)
         and health(launched)["a-0"]["up"])
    wait(launched, "b-0 on another node",
         lambda: (e := health(launched)["b-0"])["up"] and e["node"] != before)
    for model in ("a", "b"):
        r = ask(launched, model)
        assert r.status_code == 200, r.text
    out = launched.output()
    assert "a-0 is up again" in out and "re-placed on" in out


def test_scale_up_and_down_under_load_loses_nothing(launched: Launcher) -> None:
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=120) as client:
            while not done.is_set():
                r = client.post(router_url(launched) + "/v1/chat/completions", json={
                    "model": "b", "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": "hello"}]})
                seen.append((r.status_code, r.headers.get("x-hetserve-engine", "")))
                done.wait(1.0)  # paced: a new engine must be able to start on 2 cores

    def scale(n: int) -> str:
        out = subprocess.run([sys.executable, "-m", "launcher", str(launched.config),
                              "--run-dir", str(launched.run_dir), "--scale", f"b={n}"],
                             capture_output=True, text=True, timeout=700)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    thread = threading.Thread(target=load)
    thread.start()
    try:
        assert "starting b-1" in scale(2)
        wait(launched, "b-1 in routing", lambda: health(launched).get("b-1", {}).get("up"))
        wait(launched, "a request on b-1", lambda: any(e == "b-1" for _, e in seen))
        assert "draining b-1" in scale(1)
        wait(launched, "b-1 gone", lambda: "b-1" not in health(launched))
        count = len(seen)
        wait(launched, "requests after the drain", lambda: len(seen) > count + 3)
    finally:
        done.set()
        thread.join(timeout=130)
    assert seen and all(status == 200 for status, _ in seen), seen
    out = launched.output()
    assert "b-1 joined routing" in out and "b-1 drained and stopped" in out
    resolved = load_cluster_config(launched.run_dir / "cluster.resolved.toml")
    assert [i.name for i in resolved.instances()] == ["a-0", "b-0"]
    assert engine_pid(launched, "b-1") is None


def test_stop_leaves_nothing_behind(launched: Launcher) -> None:
    launched.proc.send_signal(signal.SIGTERM)
    assert launched.proc.wait(timeout=120) == 0, launched.output()
    groups = ray.util.placement_group_table().values()
    assert groups and all(g["state"] == "REMOVED" for g in groups), groups
    from ray._private.state import actors
    assert all(a["State"] == "DEAD" for a in actors().values())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _marked(launched.run_dir):
        time.sleep(0.5)
    assert not _marked(launched.run_dir)
    assert not _vllm() - BEFORE  # no EngineCore or worker outlived its engine


def _vllm() -> set[int]:
    """vLLM's live engine-core and worker processes (named by setproctitle)."""
    return {p.pid for p in psutil.process_iter(["name", "status"])
            if (p.info["name"] or "").startswith("VLLM")
            and p.info["status"] != psutil.STATUS_ZOMBIE}


BEFORE = _vllm()
"""Those of other programs, there before these tests."""


def _marked(run_dir: Path) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER_ENV) == str(run_dir):
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out
