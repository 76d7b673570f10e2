"""One request's path through the router (docs/architecture.md, "One request's path"): the
modules its control flow passes through, from the HTTP route to each of its three seams
(the tokenizer, the policy's decision, the engine client), are the ones the page lists,
at most 8 (issue 56, item 5). Measured, not declared: a real router app on loopback
serves a real chat request (HTTP, admission, tokenizer, Chimera, the proxy); a profiler
hook records the call stack, as modules of ``router/``, each time a seam is entered. The
engine is a loopback HTTP server that answers at once (no engine is under test here)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

import router
from router.app import FRONT, create_app
from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import RemoteEngine
from router.policies.chimera import Chimera
from router.tokenize import ModelTokenizer
from router.upstream import Upstream
from tests.remote_cluster import silent

SPINE = ["routes/openai.py", "app.py", "admission/admit.py", "tokenize.py", "proxy.py",
         "dispatch/routing.py", "policies/chimera.py", "upstream.py"]
"""The modules of docs/architecture.md's path, in its order (its test keeps both true)."""
ROOT = Path(router.__file__).parent
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "choices": [{
    "index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


def _module(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else None


def _stacks() -> dict[str, list[str]]:
    """Per seam, the ``router/`` modules on the stack (outermost first, each once) when a
    chat request through the app entered it."""
    seams = {ModelTokenizer.prompt.__code__: "tokenizer", Chimera.decide.__code__: "policy",
             Upstream.send.__code__: "engine client"}
    seen: dict[str, list[str]] = {}

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code not in seams:
            return
        stack, f = [], frame.f_back
        while f is not None:
            if (module := _module(f)) is not None and module not in stack:
                stack.append(module)
            f = f.f_back
        seen[seams[frame.f_code]] = stack[::-1]

    def config(engine_url: str) -> ClusterConfig:
        return ClusterConfig(source="test.toml", router=RouterConfig(
            policy="chimera", heartbeat_timeout_s=1e9, policies={"chimera": {
                "static_prior": True, "confidence": {"tiny-a": 0.6, "tiny-b": 0.8},
                "mean_output_tokens": {"tiny-a": 48, "tiny-b": 48},
                "decode_ms_per_token": {"tiny-a": 2.5, "tiny-b": 10.0},
                "max_batch_size": {"tiny-a": 8, "tiny-b": 8}}}),
            engines=[RemoteEngine(name=f"{m}-0", served_model_name=m, url=engine_url,
                                  model=f"builtin:{m}", max_model_len=1024,
                                  telemetry_endpoint=silent(m)[0],
                                  kv_events_endpoint=silent(m)[1])
                     for m in ("tiny-a", "tiny-b")])

    async def answer(_request: web.Request) -> web.Response:
        return web.Response(body=ANSWER, content_type="application/json")

    async def run() -> None:
        engine = web.Application()
        engine.router.add_post("/v1/chat/completions", answer)
        async with TestServer(engine, host="127.0.0.1") as engine_server:
            app = create_app(config(str(engine_server.make_url("")).rstrip("/")))
            async with TestServer(app, host="127.0.0.1") as server:
                for state in app[FRONT].core.state.table.engines.values():
                    state.last_seen = time.monotonic()
                async with aiohttp.ClientSession() as session:
                    body = {"model": "auto", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "Name a prime."}]}
                    sys.setprofile(hook)
                    try:
                        async with session.post(server.make_url("/v1/chat/completions"),
                                                json=body) as resp:
                            assert resp.status == 200, await resp.text()
                    finally:
                        sys.setprofile(None)

    asyncio.run(run())
    return seen


def test_a_requests_control_flow_passes_through_the_documented_modules() -> None:
    stacks = _stacks()
    assert set(stacks) == {"tokenizer", "policy", "engine client"}, stacks
    # the seams' own modules, and every module on the stack to each of them
    on_path = {m for s in stacks.values() for m in s} | {
        "tokenize.py", "policies/chimera.py", "upstream.py"}
    assert on_path == set(SPINE), (stacks, sorted(on_path ^ set(SPINE)))
    assert len(SPINE) <= 8
    # the route hands the request on once: admission returns to the front, not the route
    assert stacks["engine client"][:3] == ["routes/openai.py", "app.py", "proxy.py"]
    assert stacks["tokenizer"][:3] == ["routes/openai.py", "app.py", "admission/admit.py"]


def test_the_architecture_page_lists_the_path() -> None:
    """docs/architecture.md's path names every module of ``SPINE``."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    section = page.split("## One request's path", 1)[1].split("\n## ", 1)[0]
    assert all(f"router/{m}" in section for m in SPINE), [
        m for m in SPINE if f"router/{m}" not in section]
