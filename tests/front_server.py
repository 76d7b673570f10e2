"""The router's app served in the test's own event loop on a loopback port, as
``python -m router`` serves it (``RUNNER_OPTIONS``), with an aiohttp client to it."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pathlib import Path

from router.app import RUNNER_OPTIONS
from router.config.cluster import ClusterConfig, load_cluster_config


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[TestClient[web.Request,
                                                                     web.Application]]:
    """A client of ``app`` (started, lifespan included) on 127.0.0.1."""
    server = TestServer(app, host="127.0.0.1", **RUNNER_OPTIONS)
    async with TestClient(server) as client:
        yield client


def one_engine_cluster(tmp_path: Path, engine_port: int, router_port: int,
                       router_keys: str = "") -> ClusterConfig:
    """A round-robin router over one remote engine ``a`` (model ``tiny-a``) at
    ``127.0.0.1:engine_port``; ``router_keys``: more ``[router]`` lines."""
    (tmp_path / "c.toml").write_text(
        f'[router]\npolicy = "round_robin"\nport = {router_port}\n{router_keys}'
        f'[[engines]]\nname = "a"\nurl = "http://127.0.0.1:{engine_port}"\n'
        'model = "builtin:tiny-a"\nserved_model_name = "tiny-a"\n'
        f'telemetry_endpoint = "ipc://{tmp_path}/a.t"\n'
        f'kv_events_endpoint = "ipc://{tmp_path}/a.k"\n')
    return load_cluster_config(tmp_path / "c.toml")
