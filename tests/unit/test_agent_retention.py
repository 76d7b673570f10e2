"""The retention hint the router sends for an agent session that sends no hetserve header
(issue 60): the router's real front (``Front.handle``: admission, policy, proxy) builds
the engine's body; the engine client is the seam that receives it (no engine: the body is
what is under test)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from router.app import Front
from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import RemoteEngine
from router.engine_client import EngineCall
from scheduler_patches.contract import (
    RETAIN_FINAL,
    RETAIN_PROGRAM,
    RETAIN_RETURN,
    XARGS_FIELD,
)
from tests.remote_cluster import silent

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}]
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "choices": [{
    "index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


class _Reply:
    status, content_type = 200, "application/json"

    async def read(self) -> bytes:
        return ANSWER

    def cancel(self) -> None:
        pass


class _Engines:
    """Answers every call at once and keeps the body each engine was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def send(self, call: EngineCall) -> _Reply:
        self.bodies.append(json.loads(call.body))
        return _Reply()

    async def aclose(self) -> None:
        pass


def _session(turns: int, tools: bool = True) -> list[dict[str, Any]]:
    """Each call's body: the conversation so far, grown by the reply and a tool result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the test"}]
    bodies = []
    for turn in range(turns):
        bodies.append({"model": "tiny-a", "messages": list(messages), "max_tokens": 4,
                       **({"tools": TOOLS} if tools else {})})
        messages += [{"role": "assistant", "content": f"step {turn}"},
                     {"role": "user", "content": f"tool said {turn}"}]
    return bodies


def _run(bodies: list[dict[str, Any]], headers: dict[str, str], gap_s: float,
         monkeypatch: pytest.MonkeyPatch, **router: Any) -> list[dict[str, Any]]:
    """The xargs each call of a session sent to its engine, ``gap_s`` between calls."""
    monkeypatch.setenv("HS_TEST_API_KEYS", "untrusted-key")
    monkeypatch.setenv("HS_TEST_TRUSTED_KEYS", "trusted-key")
    engines = _Engines()
    cfg = ClusterConfig(source="test.toml", router=RouterConfig(
        policy="random_mix", policies={"random_mix": {"big_model": "tiny-a", "share": 1.0}},
        heartbeat_timeout_s=1e9, **router), engines=[RemoteEngine(
            name=name, served_model_name="tiny-a", url=f"http://{name}:8000",
            model="builtin:tiny-a", max_model_len=1024, telemetry_endpoint=silent(name)[0],
            kv_events_endpoint=silent(name)[1]) for name in ("e0", "e1")])

    async def go() -> None:
        front = Front(cfg, engine_client=engines)
        await front.start()
        try:
            for engine in front.core.state.table.engines.values():
                engine.last_seen = time.monotonic()
            for body in bodies:
                raw = json.dumps(body).encode()

                async def read(raw: bytes = raw) -> bytes:
                    return raw
                response = await front.handle("chat", headers, read)
                assert response.status == 200
                await asyncio.sleep(gap_s)
        finally:
            await front.stop()

    asyncio.run(go())
    return [b.get(XARGS_FIELD) or {} for b in engines.bodies]


def test_an_agents_calls_ask_the_engine_to_keep_their_prefix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call of a headerless session that offers tools carries its program's hint
    (one program, never final); from the third call on, the expected return is the gap
    its last return took (the first two: unknown, the engine's TTL)."""
    sent = _run(_session(4), {}, 0.2, monkeypatch)
    assert len({x[RETAIN_PROGRAM] for x in sent}) == 1
    assert sent[0][RETAIN_PROGRAM].startswith("new:")
    assert all(x[RETAIN_FINAL] == 0 for x in sent)
    assert RETAIN_RETURN not in sent[0] and RETAIN_RETURN not in sent[1]
    assert all(0.2 <= x[RETAIN_RETURN] < 5.0 for x in sent[2:])


def test_calls_without_tools_or_from_untrusted_keys_claim_no_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that offers no tools (not an agent's step) and any call from a key that is
    not trusted (retention claims engine memory, as the workflow's ranking fields do)
    send no hint; the trusted key's do."""
    keys = {"api_keys_env": "HS_TEST_API_KEYS", "trusted_keys_env": "HS_TEST_TRUSTED_KEYS"}
    assert _run(_session(2, tools=False), {}, 0.0, monkeypatch) == [{}, {}]
    untrusted = {"authorization": "Bearer untrusted-key"}
    assert _run(_session(2), untrusted, 0.0, monkeypatch, **keys) == [{}, {}]
    trusted = {"authorization": "Bearer trusted-key"}
    assert all(RETAIN_PROGRAM in x for x in _run(_session(2), trusted, 0.0, monkeypatch,
                                                  **keys))
