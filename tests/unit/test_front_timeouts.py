"""Stream timeouts of the front, served on loopback in process: an engine that starts a
stream and then goes silent (hung, SIGSTOPped) ends the client's stream with an OpenAI
error event after ``[router] stream_stall_timeout_s`` instead of the 600 s read timeout,
and is marked down (until its health probe answers). The engine is a loopback aiohttp app
(the router's behaviour is what is tested; tests/integration stops real engines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.app import FRONT, create_app
from router.upstream import StreamResult, StreamTimeouts, Upstream, UpstreamError
from tests.front_server import one_engine_cluster, served

EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'


def test_a_stalled_stream_ends_with_an_error_and_the_engine_goes_down(tmp_path: Path) -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def chat(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(EVENT)
            await release.wait()  # hung after its first token
            return resp

        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(engine_app, host="127.0.0.1") as engine:
            app = create_app(one_engine_cluster(tmp_path, engine.port, 9321,
                                                "stream_stall_timeout_s = 0.3\n"))
            body = {"model": "tiny-a", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                async with client.post("/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    text = await asyncio.wait_for(resp.read(), 10)
                release.set()
                first, error = text.split(b"\n\n")[:2]
                assert first + b"\n\n" == EVENT and b"[DONE]" not in text
                err = json.loads(error.removeprefix(b"data: "))["error"]
                assert err["code"] == "upstream_timeout"
                assert "router.stream_stall_timeout_s" in err["message"]
                engine_state = app[FRONT].core.state.table.engines["a"]
                assert engine_state.down_reason and "sent nothing" in engine_state.down_reason
                async with client.post("/v1/chat/completions", json=body) as again:
                    assert again.status == 503  # nothing up until the probe succeeds
    asyncio.run(go())


@pytest.mark.parametrize("waits, fragment", [
    ((0.1, 0.0), None),  # both silences within their limits
    ((0.5, 0.0), r"0.3 s before its first event \(router.stream_first_byte_timeout_s\)"),
    ((0.0, 0.3), r"0.15 s between two events \(router.stream_stall_timeout_s\)"),
])
def test_stream_timeouts_name_the_setting(waits: tuple[float, float],
                                          fragment: str | None) -> None:
    """The limits are aiohttp's read timer, switched from the first-byte limit to the
    stall limit at the first event; real sockets on loopback."""
    first_wait, later_wait = waits

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(first_wait)
        await resp.write(EVENT)
        await asyncio.sleep(later_wait)
        await resp.write(EVENT)
        return resp

    async def relay() -> bytes:
        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(engine_app, host="127.0.0.1") as engine:
            upstream = Upstream(10, 4, StreamTimeouts(0.3, 0.15))
            try:
                resp = await upstream.open("e", str(engine.make_url("/v1/chat/completions")),
                                           b"{}", {}, stream=True)
                try:
                    return b"".join([e async for e in upstream.events("e", resp,
                                                                      StreamResult(), False)])
                finally:
                    resp.release()
            finally:
                await upstream.aclose()

    if fragment is None:
        assert asyncio.run(relay()) == EVENT + EVENT
        return
    with pytest.raises(UpstreamError, match=fragment) as info:
        asyncio.run(relay())
    assert (info.value.kind, info.value.status) == ("timeout", 504)
