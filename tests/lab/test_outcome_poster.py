"""The live replay's agent reports each attempt's outcome over HTTP
(``kernels_bench.lab.replay.client.outcome_poster``); the router's own outcome route is
tested in tests/unit/test_online.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from aiohttp import web
from aiohttp.test_utils import TestServer

from kernels_bench.lab.replay.client import outcome_poster


def test_outcomes_are_posted_in_the_background_and_awaited() -> None:
    got: list[dict[str, Any]] = []

    async def route(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.json_response({"verdict": "accepted"})

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/v1/hetserve/outcomes", route)
        async with TestServer(app, host="127.0.0.1") as server, httpx.AsyncClient() as http:
            pending: set[asyncio.Task[Any]] = set()
            report = outcome_poster(http, str(server.make_url("/v1/hetserve/outcomes")),
                                    pending)
            report("j1.1", False)
            report("j1.2", True)
            assert len(pending) == 2
            replies = await asyncio.gather(*pending)
            assert [r.status_code for r in replies] == [200, 200]

    asyncio.run(run())
    assert sorted(got, key=json.dumps) == [{"passed": False, "program_id": "j1.1"},
                                           {"passed": True, "program_id": "j1.2"}]
