"""Engines added and removed while the router runs (``POST /admin/engines/{id}/add`` and
``.../remove``, what the launcher's ``--scale`` does), through the real front before
loopback stand-in engines, with the new engine's telemetry on a real ZeroMQ socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.app import create_app
from router.config.cluster import load_cluster_config
from tests.front_server import served
from tests.unit.test_front_redispatch import ANSWER, good
from tests.unit.test_state_engines import snap_frames

BODY = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def entry(tmp_path: Path, name: str, port: int, model: str = "tiny-a") -> dict[str, Any]:
    return {"name": name, "url": f"http://127.0.0.1:{port}", "model": "builtin:tiny-a",
            "served_model_name": model, "telemetry_endpoint": f"ipc://{tmp_path}/{name}.t",
            "kv_events_endpoint": f"ipc://{tmp_path}/{name}.k", "node": "n2 (abc)"}


def test_added_engines_are_routed_to_and_removed_ones_drained_first(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await request.read()
        await release.wait()
        return web.json_response(ANSWER)

    async def go() -> None:
        fast_app, slow_app = web.Application(), web.Application()
        fast_app.router.add_post("/v1/chat/completions", good)
        slow_app.router.add_post("/v1/chat/completions", slow)
        async with TestServer(fast_app, host="127.0.0.1") as a, \
                TestServer(slow_app, host="127.0.0.1") as b:
            (tmp_path / "c.toml").write_text(
                '[router]\npolicy = "round_robin"\nport = 9398\n[[engines]]\n'
                + "".join(f"{k} = {v!r}\n".replace("'", '"')
                          for k, v in entry(tmp_path, "a-0", a.port).items() if k != "node"))
            app = create_app(load_cluster_config(tmp_path / "c.toml"))
            async with served(app) as client:
                async def post(path: str, **kw: Any) -> tuple[int, Any]:
                    async with client.post(path, **kw) as r:
                        return r.status, await r.json()

                # refused: another model, a name taken, a body naming another engine, a
                # node too long, an entry too long for the other router workers
                for bad, name in ((entry(tmp_path, "x-0", b.port, model="tiny-z"), "x-0"),
                                  (entry(tmp_path, "a-1", b.port), "a-2"),
                                  (entry(tmp_path, "a-1", b.port) | {"node": "n" * 1025},
                                   "a-1"),
                                  (entry(tmp_path, "a-1", b.port) | {"model": "m" * 17000},
                                   "a-1")):
                    status, body = await post(f"/admin/engines/{name}/add", json=bad)
                    assert status == 400, body
                assert "over 16384 characters" in body["error"]["message"]
                status, _ = await post("/admin/engines/a-0/add",
                                       json=entry(tmp_path, "a-0", b.port))
                assert status == 404
                status, body = await post("/admin/engines/a-1/add",
                                          json=entry(tmp_path, "a-1", b.port))
                assert status == 200 and body["node"] == "n2 (abc)", body

                # its telemetry endpoint is listened on: a snapshot sent there is counted
                ctx = zmq.asyncio.Context()
                pub = ctx.socket(zmq.PUB)
                pub.connect(f"ipc://{tmp_path}/a-1.t")
                for seq in range(40):
                    await pub.send_multipart(snap_frames("a-1", seq))
                    await asyncio.sleep(0.02)
                pub.close(linger=0)
                ctx.term()
                async with client.get("/metrics") as r:
                    metrics = await r.text()
                assert 'hetserve_telemetry_frames_total{engine="a-1",stream="snapshot"}' \
                    in metrics and 'node="n2 (abc)"' in metrics

                # round robin now takes turns over both: the slow one holds a request
                fast = await client.post("/v1/chat/completions", json=BODY)
                held = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
                await asyncio.sleep(0.3)
                assert {fast.headers["x-hetserve-engine"]} <= {"a-0", "a-1"}
                async with client.get("/health") as r:
                    inflight = {e["name"]: e["inflight"] for e in (await r.json())["instances"]}
                assert sorted(inflight.values()) == [0, 1], inflight
                busy = max(inflight, key=lambda k: inflight[k])
                assert busy == "a-1"

                status, body = await post("/admin/engines/a-1/remove")
                assert status == 409 and "mark" in body["error"]["message"]
                await post("/admin/engines/a-1/down")
                status, body = await post("/admin/engines/a-1/remove")
                assert status == 409 and "in flight" in body["error"]["message"], body
                release.set()
                assert (await held).status == 200
                status, body = await post("/admin/engines/a-1/remove")
                assert status == 200, body
                status, body = await post("/admin/engines/a-0/down")
                status, body = await post("/admin/engines/a-0/remove")
                assert status == 409 and "last engine" in body["error"]["message"], body
                await post("/admin/engines/a-0/up")
                for _ in range(3):
                    async with client.post("/v1/chat/completions", json=BODY) as r:
                        assert r.status == 200 and r.headers["x-hetserve-engine"] == "a-0"
                async with client.get("/health") as r:
                    assert [e["name"] for e in (await r.json())["instances"]] == ["a-0"]
    asyncio.run(go())
