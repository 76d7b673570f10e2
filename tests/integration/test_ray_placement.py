"""launcher.backends.ray on a real Ray cluster with declared (not physical) GPUs: a
tensor-parallel replica gets one GPU per rank on one node and its process sees them all;
a replica with no room is reported, not left waiting; releasing frees the node; a dead
replica's port waits for its restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import LaunchError
from launcher.backends.ray import RayBackend, placement
from launcher.plan import NODE_HOST, NODE_PORT
from launcher.process import ProcessSpec
from launcher.settings import EngineCluster

ray = pytest.importorskip("ray", reason="the Ray extra (pip install -e '.[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

SCRIPT = ("import os, sys, time; print('SEES', os.environ.get('CUDA_VISIBLE_DEVICES'), "
          "sys.argv[1:], os.environ.get('OMP_NUM_THREADS'), flush=True); time.sleep(60)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": 2, "node_ip_address": "127.0.0.1",
        "include_dashboard": False})
    try:
        yield c
    finally:
        c.shutdown()


def spec(tmp_path: Path, name: str, gpus: int) -> ProcessSpec:
    where = placement(gpus, 1, {}, 9400, frozenset({9400}), "tcp://127.0.0.1:1",
                      "tcp://127.0.0.1:2")
    return ProcessSpec(name=name, argv=["python", "-c", SCRIPT, NODE_HOST, NODE_PORT],
                       env={"X": "1"}, log_path=tmp_path / f"{name}.log", health_url=None,
                       placement=where)


def test_a_tensor_parallel_replica_sees_all_its_gpus(cluster: Cluster, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    backend = RayBackend(EngineCluster(backend="ray", address=cluster.address,
                                       placement_timeout_s=5), tmp_path)
    try:
        first = backend.start(spec(tmp_path, "tp-0", gpus=2))
        assert first.url.startswith("http://127.0.0.1:") and first.port != 9400
        deadline = time.monotonic() + 60
        while "SEES" not in first.tail(5) and time.monotonic() < deadline:
            time.sleep(0.2)
        line = next(ln for ln in first.tail(5).splitlines() if ln.startswith("SEES"))
        ids = line.split()[1].split(",")
        assert sorted(ids) == ["0", "1"], line  # both GPUs of the node, one per rank
        assert f"'127.0.0.1', '{first.port}'" in line and line.endswith("None")
        assert first.poll() is None and first.alive()
        lines = backend.fit([("tp-1", spec(tmp_path, "tp-1", 2).placement)])
        assert "does not fit" in lines[0] and "GPU 0" in lines[0]
        with pytest.raises(LaunchError, match="no node of the Ray cluster has room"):
            backend.start(spec(tmp_path, "tp-1", gpus=2))
        first.kill()
        assert ray.util.placement_group_table(first.group)["state"] == "REMOVED"
        assert first.poll() == "released"
        second = backend.start(spec(tmp_path, "tp-1", gpus=2))  # the GPUs are free again
        assert second.poll() is None
        second.terminate()
        deadline = time.monotonic() + 30
        while second.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert second.poll() == "killed by SIGTERM"
    finally:
        backend.close()


def test_a_dead_replica_s_port_waits_for_its_restart(cluster: Cluster, tmp_path: Path) -> None:
    """A replica killed (as the supervisor does before a restart) keeps its port: one
    placed meanwhile takes another (two replicas on one port made the router's file
    invalid and stopped the cluster), and the restarted replica may take its own again."""
    backend = RayBackend(EngineCluster(backend="ray", address=cluster.address,
                                       placement_timeout_s=5), tmp_path)
    try:
        a = backend.start(spec(tmp_path, "a-0", gpus=0))
        a.kill()
        b = backend.start(spec(tmp_path, "b-0", gpus=0))
        assert b.port != a.port
        again = backend.start(spec(tmp_path, "a-0", gpus=0))
        assert again.port == a.port
    finally:
        backend.close()
