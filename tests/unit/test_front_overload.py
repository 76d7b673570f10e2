"""Overload answers of the front, served on loopback in process: beyond ``[router]
max_inflight`` a request gets 503 ``overloaded`` with ``retry-after`` at once, and the
requests in flight finish normally. The engine is a loopback aiohttp app that holds its
answer until the test releases it (the router's behaviour is what is tested)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from router.app import create_app
from tests.front_server import one_engine_cluster, served

ANSWER = {"id": "x", "object": "chat.completion", "choices": [],
          "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}


def test_beyond_max_inflight_a_503_with_retry_after(tmp_path: Path) -> None:
    async def go() -> None:
        release, arrived = asyncio.Event(), asyncio.Event()

        async def chat(_request: web.Request) -> web.Response:
            arrived.set()
            await release.wait()
            return web.json_response(ANSWER)

        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(engine_app, host="127.0.0.1") as engine:
            app = create_app(one_engine_cluster(tmp_path, engine.port, 9320,
                                                "max_inflight = 1\n"))
            body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                first = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
                await asyncio.wait_for(arrived.wait(), 30)
                async with client.post("/v1/chat/completions", json=body) as second:
                    error = (await second.json())["error"]
                    assert second.status == 503 and second.headers["retry-after"] == "1"
                    assert error["code"] == "overloaded" and "max_inflight" in error["message"]
                release.set()
                async with await first as resp:
                    assert resp.status == 200 and (await resp.json())["usage"]["total_tokens"] == 4
                async with client.post("/v1/chat/completions", json=body) as third:
                    assert third.status == 200  # the slot is free again
                metrics = await (await client.get("/metrics")).text()
                assert 'status="503"' in metrics
    asyncio.run(go())
