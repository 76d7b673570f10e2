"""The router's app served in the test's own event loop on a loopback port, as
``python -m router`` serves it (``RUNNER_OPTIONS``), with an aiohttp client to it."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.app import RUNNER_OPTIONS


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[TestClient[web.Request,
                                                                     web.Application]]:
    """A client of ``app`` (started, lifespan included) on 127.0.0.1."""
    server = TestServer(app, host="127.0.0.1", **RUNNER_OPTIONS)
    async with TestClient(server) as client:
        yield client
