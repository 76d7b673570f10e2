"""The gauges a soak samples on every router worker (issue 35): process RSS and
descriptors, asyncio tasks, the in-flight ledger and the open requests, read while a
request is held by a loopback stand-in engine and after it was answered."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from router.app import create_app
from tests.front_server import one_engine_cluster, served

ANSWER = {"id": "x", "object": "chat.completion", "model": "tiny-a", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def value(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_gauges_follow_a_request_in_flight(tmp_path: Path) -> None:
    async def go() -> None:
        arrived, release = asyncio.Event(), asyncio.Event()

        async def held(request: web.Request) -> web.Response:
            await request.read()
            arrived.set()
            await release.wait()
            return web.json_response(ANSWER)

        engine = web.Application()
        engine.router.add_post("/v1/chat/completions", held)
        async with TestServer(engine, host="127.0.0.1") as eng:
            app = create_app(one_engine_cluster(tmp_path, eng.port, 9398))
            body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                call = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
                await arrived.wait()
                during = await (await client.get("/metrics")).text()
                release.set()
                resp = await call
                assert resp.status == 200, await resp.text()
                resp.release()
                after = await (await client.get("/metrics")).text()
        assert value(during, "hetserve_inflight_ledger_entries") == 1
        assert value(during, "hetserve_open_requests") == 1
        assert value(after, "hetserve_inflight_ledger_entries") == 0
        assert value(after, "hetserve_open_requests") == 0
        # the held request's handler is a task of the loop, beside the server's own
        assert value(during, "hetserve_asyncio_tasks") > value(after, "hetserve_asyncio_tasks")
        assert value(after, "process_resident_memory_bytes") > 0
        assert value(after, "process_open_fds") > 0
    asyncio.run(go())
