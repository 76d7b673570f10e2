"""Two router workers on the port socket the launcher binds and both inherit (issue 35):
one SIGKILLed under load refuses no connection and breaks only those it had accepted.

The launcher starts the two workers of a cluster whose one engine is a loopback stand-in
(``kernels_bench.front.standin``: streams of 20 events 50 ms apart, no vLLM), so the test
takes about half a minute. Clients keep streams going on keep-alive connections and open
a new connection for every short request. Worker 0 is SIGSTOPped for half a second (so it
accepts nothing more and its connections can be listed; with a socket per worker,
``SO_REUSEPORT``, the kernel keeps queueing new connections on it meanwhile), then
SIGKILLed. Bounded: 12 client threads, about 3 s of load, loopback only.

    .venv/bin/python -m pytest tests/e2e/test_shared_port.py -v
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from kernels_bench.lab.faults.signals import Cluster
from router.config.cluster import load_cluster_config
from tests.engine_proc import free_port

START_TIMEOUT_S = 120.0
STREAM_CLIENTS = 6
"""Threads streaming on one keep-alive connection each (a new one after a failure)."""
FRESH_CLIENTS = 6
"""Threads sending a short request on a new connection each time."""
REQUEST_S = 1.0
"""How long the stand-in takes to answer one request (20 chunks 50 ms apart)."""


@dataclass
class Sent:
    """One request: its connection's local port, when it was sent, how it ended."""

    port: int
    at: float
    fresh: bool
    """Sent on a connection opened for it (a short request), not on a kept-alive stream."""
    outcome: str = "pending"
    """``ok``, ``refused`` (the connection was refused) or ``failed`` (anything else)."""
    detail: str = ""


class Load:
    """The client threads and every request they sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent: list[Sent] = []
        self.stop = threading.Event()
        n = STREAM_CLIENTS + FRESH_CLIENTS
        self.threads = [threading.Thread(target=self._client,
                                         args=(i < STREAM_CLIENTS, i * REQUEST_S / n))
                        for i in range(n)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _client(self, stream: bool, delay_s: float) -> None:
        conn: http.client.HTTPConnection | None = None
        self.stop.wait(delay_s)  # staggered: the requests of the clients do not move in step
        body = json.dumps({"model": "tiny-a", "stream": stream, "max_tokens": 8,
                           "messages": [{"role": "user", "content": "hi"}]})
        while not self.stop.is_set():
            at = time.time()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
                    conn.connect()
            except ConnectionRefusedError as e:
                self.sent.append(Sent(0, at, not stream, "refused", repr(e)))
                conn = None
                time.sleep(0.05)
                continue
            assert conn.sock is not None
            s = Sent(conn.sock.getsockname()[1], at, not stream)
            self.sent.append(s)
            try:
                conn.request("POST", "/v1/chat/completions", body, headers={
                    "Content-Type": "application/json",
                    **({} if stream else {"Connection": "close"})})
                resp = conn.getresponse()
                data = resp.read()
                done = data.rstrip().endswith(b"data: [DONE]") if stream else b"choices" in data
                s.outcome = "ok" if resp.status == 200 and done else "failed"
                s.detail = f"{resp.status}: {data[-200:]!r}"
            except (OSError, http.client.HTTPException) as e:
                s.outcome, s.detail = "failed", repr(e)
            if s.outcome != "ok" or not stream:
                conn.close()
                conn = None


def accepted_ports(proc: psutil.Process, port: int) -> set[int]:
    """The client ports of the connections ``proc`` accepted on ``port``."""
    return {c.raddr.port for c in proc.net_connections(kind="tcp")
            if c.laddr.port == port and c.raddr}


def socket_inode(pid: int, fd: int) -> str:
    return os.readlink(f"/proc/{pid}/fd/{fd}")


@pytest.fixture
def standin() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kernels_bench.front.standin", "--port",
                             str(port), "--chunks", "20", "--interval-ms", "50"])
    yield port
    proc.terminate()
    proc.wait(10)


def test_a_killed_worker_breaks_only_its_own_connections(tmp_path: Path,
                                                          standin: int) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'[router]\npolicy = "round_robin"\nworkers = 2\n\n'
        f'[[engines]]\nname = "e0"\nurl = "http://127.0.0.1:{standin}"\n'
        'model = "builtin:tiny-a"\nserved_model_name = "tiny-a"\n'
        f'telemetry_endpoint = "ipc://{tmp_path}/e0.t"\n'
        f'kv_events_endpoint = "ipc://{tmp_path}/e0.k"\n\n'
        f"[launcher]\nbase_port = {free_port()}\nrestart_backoff_s = 0.5\n")
    cluster = Cluster(config, tmp_path / "run")
    try:
        cluster.wait_for("the router workers", r"^router ", START_TIMEOUT_S)
        port = load_cluster_config(tmp_path / "run" / "cluster.resolved.toml").router.port
        assert port is not None
        victim = cluster.process(["--worker", "0"])
        fd = int(victim.cmdline()[victim.cmdline().index("--listen-fd") + 1])
        shared = socket_inode(cluster.proc.pid, fd)
        assert socket_inode(victim.pid, fd) == shared
        mark = len(cluster.output())
        with Load(port) as load:
            time.sleep(1.0)
            victim.suspend()
            time.sleep(0.5)  # new connections keep arriving meanwhile
            held = accepted_ports(victim, port)
            stopped = time.time()
            victim.send_signal(signal.SIGKILL)
            killed = time.time()
            time.sleep(1.5)
        cluster.wait_for("router-0 back", r"router-0 is up again", START_TIMEOUT_S, mark)
        restarted = cluster.process(["--worker", "0"])
        assert socket_inode(restarted.pid, fd) == shared  # the same socket, not a new one
    finally:
        cluster.stop()
    refused = [s for s in load.sent if s.outcome == "refused"]
    failed = [s for s in load.sent if s.outcome == "failed"]
    assert not refused, refused[:5]
    assert held, "the stopped worker held no connection: the kill tested nothing"
    others = [s for s in failed if s.port not in held]
    assert not others, (f"{len(others)} requests failed on connections worker 0 had not "
                        f"accepted: {others[:5]}")
    fresh_while_stopped = [s for s in load.sent if s.fresh and stopped - 0.5 <= s.at < stopped]
    assert fresh_while_stopped, "no new connection reached the shared port while worker 0 stood"
    assert [s for s in load.sent if s.at > killed and s.outcome == "ok"], \
        "nothing was served after the kill"
