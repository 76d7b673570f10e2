"""Conflicting admin calls at once to two real router worker processes (issue 35).

Two ``python -m router --worker I`` processes of one cluster (``workers = 2``), linked by
their real ZeroMQ ipc peer sockets, each also listening alone on its ``worker_ports[I]``.
A ``down`` to worker 0 and an ``up`` to worker 1 are sent together, then two ``add``s of
one name with different URLs, ``TRIES`` times each (an add that reaches its worker after
the other's has is refused, 404 or 400: not a conflict; at least one try must have both
applied). Once the peer messages have arrived
(polled on both workers' ``/health``, at most ``SETTLE_S``) the two must report the same
engines, and it must be the change of the higher version (the one the answers name).
Before each change carried its engine's version, every try of both kinds left the
workers disagreeing (docs/reliability.md, "The admin API across router workers").
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.engine_proc import free_port

TRIES = 10
SETTLE_S = 10.0
"""Longest wait for both workers to agree (a bound, not a measurement)."""
START_S = 60.0


def _write_config(tmp: Path, port: int, worker_ports: list[int]) -> Path:
    path = tmp / "cluster.toml"
    path.write_text(
        f'[router]\npolicy = "round_robin"\nport = {port}\nworkers = 2\n'
        f"worker_ports = {worker_ports}\nsync_dir = \"{tmp}\"\n"
        '[[engines]]\nname = "a"\nurl = "http://127.0.0.1:9001"\n'
        'model = "builtin:tiny-a"\nserved_model_name = "tiny-a"\n'
        f'telemetry_endpoint = "ipc://{tmp}/a.t"\nkv_events_endpoint = "ipc://{tmp}/a.kv"\n')
    return path


def _engine(tmp: Path, name: str, port: int) -> dict[str, Any]:
    return {"name": name, "url": f"http://127.0.0.1:{port}", "model": "builtin:tiny-a",
            "served_model_name": "tiny-a", "telemetry_endpoint": f"ipc://{tmp}/{name}.t",
            "kv_events_endpoint": f"ipc://{tmp}/{name}.kv"}


async def _table(client: httpx.AsyncClient, base: str) -> dict[str, tuple[Any, ...]]:
    health = (await client.get(f"{base}/health")).json()
    return {e["name"]: (e["url"], e["up"], e["node"]) for e in health["instances"]}


async def _tables(client: httpx.AsyncClient, bases: list[str]) -> list[dict[str, Any]]:
    return [await _table(client, b) for b in bases]


async def _agreed(client: httpx.AsyncClient, bases: list[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + SETTLE_S
    tables = await _tables(client, bases)
    while tables[0] != tables[1] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        tables = await _tables(client, bases)
    return tables


async def _scenario(tmp: Path, bases: list[str]) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        for base in bases:  # started
            deadline = time.monotonic() + START_S
            while True:
                try:
                    if (await client.get(f"{base}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"{base} did not start"
                await asyncio.sleep(0.2)
        for sender, receiver in ((0, 1), (1, 0)):  # the peer subscriptions joined
            deadline = time.monotonic() + SETTLE_S
            while (await _table(client, bases[receiver]))["a"][1]:
                assert time.monotonic() < deadline, "the workers do not hear each other"
                await client.post(f"{bases[sender]}/admin/engines/a/down")
                await asyncio.sleep(0.05)
            await client.post(f"{bases[sender]}/admin/engines/a/up")
            assert (await _agreed(client, bases))[0]["a"][1]
        both = 0
        for i in range(TRIES):
            answers = await asyncio.gather(
                client.post(f"{bases[0]}/admin/engines/a/down", params={"reason": f"t{i}"}),
                client.post(f"{bases[1]}/admin/engines/a/up"))
            assert [r.status_code for r in answers] == [200, 200]
            winner = max((r.json() for r in answers), key=lambda a: a["version"])
            tables = await _agreed(client, bases)
            assert tables[0] == tables[1], ("down/up", i, tables)
            assert tables[0]["a"][1] == winner["up"], ("down/up", i, winner, tables)
            name = f"n{i}"
            answers = await asyncio.gather(*(
                client.post(f"{base}/admin/engines/{name}/add",
                            json=_engine(tmp, name, 9200 + 2 * i + w))
                for w, base in enumerate(bases)))
            # one add may reach its worker after the other's has: the name is taken (404,
            # or 400 if the other's came while this one's body was read)
            assert all(r.status_code in (200, 404) or r.status_code == 400
                       and "already an engine instance" in r.text
                       for r in answers), [r.text for r in answers]
            applied = [r.json() for r in answers if r.status_code == 200]
            assert applied, [r.text for r in answers]
            both += len(applied) == 2
            winner = max(applied, key=lambda a: a["version"])
            tables = await _agreed(client, bases)
            assert tables[0] == tables[1], ("add/add", i, tables)
            assert tables[0][name][0] == winner["url"], ("add/add", i, winner, tables)
        print(f"two adds at once, both applied by their worker: {both} of {TRIES} tries")
        assert both, "no two adds were applied at once: the test did not test them"


def test_conflicting_calls_at_once_converge_across_processes(tmp_path: Path) -> None:
    port, worker_ports = free_port(), [free_port(), free_port()]
    config = _write_config(tmp_path, port, worker_ports)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = []
    try:
        for i in (0, 1):
            log = (tmp_path / f"router-{i}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "router", "--config", str(config), "--worker", str(i),
                 "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env))
        asyncio.run(_scenario(tmp_path, [f"http://127.0.0.1:{p}" for p in worker_ports]))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    for i, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"router-{i}.log").read_text()[-2000:]
