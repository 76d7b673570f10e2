"""Re-dispatch (issue 16): a request whose engine closes the connection without a byte of
an answer (it died or restarted while the request ran) goes to another engine, and the
client never knows; a 5xx answer is not re-sent. Served on loopback in process, before
two loopback engines: one that hangs up, one that answers (the router's behaviour is what
is tested; tests/e2e kills real engines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.app import FRONT, create_app
from router.config.cluster import load_cluster_config
from tests.front_server import served

ANSWER = {"id": "x", "object": "chat.completion", "model": "tiny-a", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}}]}\n\ndata: [DONE]\n\n'


async def good(request: web.Request) -> web.StreamResponse:
    if (await request.json()).get("stream"):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(EVENT)
        return resp
    return web.json_response(ANSWER)


async def hang_up(request: web.Request) -> web.Response:
    await request.read()
    assert request.transport is not None
    request.transport.close()  # gone without a byte of an answer
    await asyncio.sleep(1)
    raise AssertionError("unreachable")


async def fail(request: web.Request) -> web.Response:
    return web.json_response({"error": "boom"}, status=500)


def _cluster(tmp_path: Path, ports: list[int]) -> object:
    text = '[router]\npolicy = "round_robin"\nport = 9399\n'
    for name, port in zip("ab", ports):
        text += (f'[[engines]]\nname = "{name}"\nurl = "http://127.0.0.1:{port}"\n'
                 'model = "builtin:tiny-a"\nserved_model_name = "tiny-a"\n'
                 f'telemetry_endpoint = "ipc://{tmp_path}/{name}.t"\n'
                 f'kv_events_endpoint = "ipc://{tmp_path}/{name}.k"\n')
    (tmp_path / "c.toml").write_text(text)
    return load_cluster_config(tmp_path / "c.toml")


@pytest.mark.parametrize("stream", [False, True])
def test_a_hang_up_before_answering_goes_to_the_other_engine(tmp_path: Path,
                                                            stream: bool) -> None:
    async def go() -> None:
        bad_app, good_app = web.Application(), web.Application()
        bad_app.router.add_post("/v1/chat/completions", hang_up)
        good_app.router.add_post("/v1/chat/completions", good)
        async with TestServer(bad_app, host="127.0.0.1") as bad, \
                TestServer(good_app, host="127.0.0.1") as ok:
            app = create_app(_cluster(tmp_path, [bad.port, ok.port]))  # type: ignore[arg-type]
            body = {"model": "tiny-a", "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                for _ in range(4):  # round robin starts on either engine
                    async with client.post("/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        assert resp.headers["x-hetserve-engine"] == "b"
                        text = await resp.read()
                        assert (b"[DONE]" in text) if stream else \
                            json.loads(text)["choices"][0]["message"]["content"] == "ok"
                metrics = await (await client.get("/metrics")).text()
            assert 'hetserve_upstream_errors_total{engine="a",kind="protocol"} 1.0' in metrics
            assert "hetserve_redispatched_total 1.0" in metrics
            assert app[FRONT].core.state.table["a"].down_reason is not None
    asyncio.run(go())


def test_a_5xx_answer_is_not_sent_again(tmp_path: Path) -> None:
    async def go() -> None:
        calls = {"b": 0}

        async def counted(request: web.Request) -> web.Response:
            calls["b"] += 1
            return await fail(request)

        apps = web.Application(), web.Application()
        apps[0].router.add_post("/v1/chat/completions", counted)
        apps[1].router.add_post("/v1/chat/completions", counted)
        async with TestServer(apps[0], host="127.0.0.1") as a, \
                TestServer(apps[1], host="127.0.0.1") as b:
            app = create_app(_cluster(tmp_path, [a.port, b.port]))  # type: ignore[arg-type]
            body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                async with client.post("/v1/chat/completions", json=body) as resp:
                    assert resp.status == 502
                    assert resp.headers["retry-after"] == "1"
                    assert "answered 500" in (await resp.json())["error"]["message"]
        assert calls["b"] == 1
    asyncio.run(go())


def test_the_engine_key_is_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``api_key_env``: every call to that engine carries its key; an unset variable
    stops the router at start with the key named."""
    seen: list[str | None] = []

    async def keyed(request: web.Request) -> web.Response:
        seen.append(request.headers.get("authorization"))
        return web.json_response(ANSWER)

    async def go() -> None:
        apps = web.Application(), web.Application()
        for engine_app in apps:
            engine_app.router.add_post("/v1/chat/completions", keyed)
        async with TestServer(apps[0], host="127.0.0.1") as a, \
                TestServer(apps[1], host="127.0.0.1") as b:
            _cluster(tmp_path, [a.port, b.port])
            text = (tmp_path / "c.toml").read_text().replace(
                'name = "b"', 'name = "b"\napi_key_env = "HS_TEST_KEY"')
            (tmp_path / "c.toml").write_text(text)
            with pytest.raises(ValueError, match="engines.b.api_key_env: the environment "
                               "variable HS_TEST_KEY is not set"):
                create_app(load_cluster_config(tmp_path / "c.toml"))
            monkeypatch.setenv("HS_TEST_KEY", "k-123")
            app = create_app(load_cluster_config(tmp_path / "c.toml"))
            body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                for _ in range(2):
                    async with client.post("/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200
        assert sorted(seen, key=str) == ["Bearer k-123", None]
    asyncio.run(go())


def test_an_engine_moved_by_the_launcher_is_followed(tmp_path: Path) -> None:
    """``POST /admin/engines/a/move?url=...`` (the launcher restarted ``a`` on another
    port): requests go to the new port; another host or a path is a 400."""
    from tests.engine_proc import free_port
    from tests.front_server import one_engine_cluster

    async def go() -> None:
        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", good)
        async with TestServer(engine_app, host="127.0.0.1") as eng:
            cfg = one_engine_cluster(tmp_path, free_port(), free_port())  # nothing there
            app = create_app(cfg)
            body = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
            async with served(app) as client:
                async with client.post("/v1/chat/completions", json=body) as resp:
                    assert resp.status in (502, 503)
                for bad in ("http://10.1.2.3:80", f"http://127.0.0.1:{eng.port}/v1", "x"):
                    async with client.post("/admin/engines/a/move", params={"url": bad}) as r:
                        assert r.status == 400 and "only its port" in (await r.json())[
                            "error"]["message"]
                async with client.post("/admin/engines/a/move",
                                       params={"url": f"http://127.0.0.1:{eng.port}"}) as r:
                    assert r.status == 200
                async with client.post("/admin/engines/a/up"):
                    pass
                async with client.post("/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
    asyncio.run(go())
