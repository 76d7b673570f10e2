"""HTTP fuzzing of the router's front, served on loopback in process in front of a
loopback stand-in engine: generated bodies (valid-looking, wrong-typed, huge, nested,
non-UTF-8) of every API (chat, completions, Responses, Messages), ``X-Hetserve-*`` and
session headers, methods and paths. Every answer must be below 500
with an OpenAI error object for 4xx, no handler may raise, and ``/health`` must answer 200
after. ``HETSERVE_FUZZ_EXAMPLES`` sets the count (default 300, seed-fixed; the 10,000-request
run of docs/reliability.md sets 10000)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.app import create_app
from tests.front_server import one_engine_cluster, served

EXAMPLES = int(os.environ.get("HETSERVE_FUZZ_EXAMPLES", "300"))
ANSWER = {"id": "x", "object": "chat.completion", "choices": [],
          "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}
EVENTS = (b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
          b'data: [DONE]\n\n')
RESPONSE = {"id": "resp_1", "object": "response", "output": [],
            "usage": {"input_tokens": 1, "output_tokens": 2}}
AGENT_EVENTS = (b'event: response.created\ndata: {"type": "response.created", "response": '
                b'{"id": "resp_2", "usage": null}}\n\n'
                b'event: message_delta\ndata: {"type": "message_delta", "usage": '
                b'{"output_tokens": 1}}\n\n')

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=False), st.text(max_size=40),
                    st.sampled_from([10**400, -1, 0, 2**63, "auto", "tiny-a", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "nobody"]),
     "content": st.one_of(st.text(max_size=200), values)}), max_size=4)
FIELDS = ["model", "messages", "prompt", "max_tokens", "n", "stream", "stream_options",
          "temperature", "priority", "workflow", "per_model", "chat_template_kwargs",
          "chat_template", "logprobs", "stop", "tools", "seed", "input", "instructions",
          "previous_response_id", "max_output_tokens", "system", "metadata",
          "prompt_cache_key", "user", "vllm_xargs", "nvext", "session_id"]
bodies = st.one_of(
    st.fixed_dictionaries({"model": st.sampled_from(["tiny-a", "auto", "ghost"]),
                           "messages": messages},
                          optional={k: values for k in FIELDS[2:]}),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=6),
    values)
HEADERS = ["x-hetserve-program-id", "x-hetserve-stage-index", "x-hetserve-num-stages",
           "x-hetserve-budget", "x-hetserve-final", "x-hetserve-weights", "authorization",
           "content-type", "x-api-key", "x-session-id", "x-claude-code-session-id",
           "x-claude-code-agent-id", "session_id"]
headers = st.dictionaries(st.sampled_from(HEADERS),
                          st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                  max_size=30), max_size=3)
raw = st.one_of(bodies.map(lambda b: json.dumps(b, ensure_ascii=False).encode(
    "utf-8", "surrogatepass")), st.binary(max_size=200),
    bodies.map(lambda b: json.dumps(b).encode().replace(b'"', b'"\x80', 1)))  # not UTF-8
paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                         "/metrics", "/v1/nothing", "/admin/engines/nope/sideways",
                         "/v1/responses/resp_1", "/v1/responses/resp_2/cancel",
                         "/v1/responses/nope", "/v1/messages/count_tokens"])
# (a real admin call from loopback may mark the engine down: legitimate, not fuzzed)
chat = st.just("/v1/chat/completions")
agents = st.sampled_from(["/v1/responses", "/v1/messages"])
calls = st.tuples(st.one_of(st.just("POST"), st.just("POST"),
                            st.sampled_from(["GET", "PUT", "DELETE"])),
                  st.one_of(chat, chat, agents, agents, st.just("/v1/completions"), paths),
                  raw, headers)


def test_generated_requests_never_get_a_5xx(tmp_path: Path) -> None:
    async def go() -> None:
        def answering(answer: dict[str, Any], events: bytes) -> Any:
            """A stand-in engine route: ``events`` to a stream, else ``answer``."""
            async def handler(request: web.Request) -> web.StreamResponse:
                body = await request.json()
                if body.get("stream"):
                    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
                    await resp.prepare(request)
                    await resp.write(events)
                    return resp
                return web.json_response(answer)
            return handler

        async def stored(request: web.Request) -> web.StreamResponse:
            return web.json_response(RESPONSE)

        chat, agent = answering(ANSWER, EVENTS), answering(RESPONSE, AGENT_EVENTS)
        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", chat)
        engine_app.router.add_post("/v1/completions", chat)
        engine_app.router.add_post("/v1/responses", agent)
        engine_app.router.add_post("/v1/messages", agent)
        engine_app.router.add_post("/v1/messages/count_tokens", stored)
        engine_app.router.add_route("*", "/v1/responses/{id:.*}", stored)
        async with TestServer(engine_app, host="127.0.0.1") as engine:
            app = create_app(one_engine_cluster(tmp_path, engine.port, 9322))
            async with served(app) as client:
                statuses: dict[int, int] = {}
                bad: list[Any] = []

                @settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                          database=None, suppress_health_check=list(HealthCheck))
                @given(calls)
                def one(call: tuple[str, str, bytes, dict[str, str]]) -> None:
                    method, path, data, hdrs = call
                    status, text = asyncio.run_coroutine_threadsafe(
                        send(method, path, data, hdrs), loop).result(60)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status >= 500 or (400 <= status < 500 and path.startswith("/v1/")
                                         and status != 404 and '"error"' not in text):
                        bad.append((call, status, text[:300]))

                async def send(method: str, path: str, data: bytes,
                               hdrs: dict[str, str]) -> tuple[int, str]:
                    async with client.request(method, path, data=data, headers=hdrs) as r:
                        return r.status, await r.text(errors="replace")

                loop = asyncio.get_running_loop()
                await asyncio.to_thread(one)
                assert not bad, bad[:5]
                assert sum(statuses.values()) >= EXAMPLES
                async with client.get("/health") as health:
                    assert health.status == 200
                print(f"fuzz: {sum(statuses.values())} requests, "
                      f"statuses {sorted(statuses.items())}")
    asyncio.run(go())
