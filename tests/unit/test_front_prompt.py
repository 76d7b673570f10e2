"""The front tokenizes for a policy that reads no prompt only when the token count bound
(``router.tokenize.TokenBound``) does not show the prompt fits: a short prompt is
forwarded untokenized, a long one is tokenized and refused with a clean 400 when it does
not fit, and ``auto`` still goes only to a model whose context fits it. Served on
loopback in process, before loopback engines that answer every call and keep its body
(the router's behaviour is what is tested; tests/integration/test_router_front.py does
it through real engines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from engine_ext.builtin_models import resolve_model
from router.app import create_app
from router.config.cluster import load_cluster_config
from router.admission.parse import parse_request
from router.tokenize import ModelTokenizer
from tests.front_server import served

ANSWER = {"id": "x", "object": "chat.completion", "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
SHORT, LONG = 64, 512
"""``max_model_len`` of the two models."""
CODE = "def main():\n    return 0\n\n"
"""Python: the built-in tokenizer (trained on Python) packs it into few tokens."""


def _cluster(tmp_path: Path, policy: str, ports: list[int]) -> Any:
    text = f'[router]\npolicy = "{policy}"\nport = 9398\n'
    for name, port, length in zip("ab", ports, (SHORT, LONG)):
        text += (f'[[engines]]\nname = "{name}"\nurl = "http://127.0.0.1:{port}"\n'
                 f'model = "builtin:tiny-a"\nserved_model_name = "m-{name}"\n'
                 f"max_model_len = {length}\n"
                 f'telemetry_endpoint = "ipc://{tmp_path}/{name}.t"\n'
                 f'kv_events_endpoint = "ipc://{tmp_path}/{name}.k"\n')
    (tmp_path / "c.toml").write_text(text)
    return load_cluster_config(tmp_path / "c.toml")


def _tokens(content: str) -> tuple[int, int]:
    """(exact tokens, bound) of a one-user-message chat prompt."""
    tok = ModelTokenizer(resolve_model("builtin:tiny-a"))
    parsed = parse_request("chat", json.dumps({"model": "m", "messages": [
        {"role": "user", "content": content}]}).encode(), {})
    bound = tok.max_prompt_tokens(parsed)
    assert bound is not None
    return len(tok.prompt(parsed).token_ids), bound


def _run(tmp_path: Path, policy: str, calls: list[dict[str, Any]]
         ) -> tuple[list[tuple[int, dict[str, Any]]], list[str], float]:
    """Each call's (status, JSON answer), the engines that got a call and the tokenized
    count (``hetserve_tokenize_latency_seconds_count``)."""
    got: list[str] = []

    def engine(name: str) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            await request.json()
            got.append(name)
            return web.json_response(ANSWER)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app

    async def go() -> tuple[list[tuple[int, dict[str, Any]]], float]:
        async with TestServer(engine("a"), host="127.0.0.1") as a, \
                TestServer(engine("b"), host="127.0.0.1") as b:
            app = create_app(_cluster(tmp_path, policy, [a.port, b.port]))
            out = []
            async with served(app) as client:
                for body in calls:
                    async with client.post("/v1/chat/completions", json=body) as resp:
                        out.append((resp.status, await resp.json()))
                metrics = await (await client.get("/metrics")).text()
        count = next(s.value for f in text_string_to_metric_families(metrics)
                     for s in f.samples if s.name == "hetserve_tokenize_latency_seconds_count")
        return out, count

    out, count = asyncio.run(go())
    return out, got, count


def _chat(model: str, content: str, max_tokens: int | None = 4) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}]}


def test_a_prompt_that_fits_by_its_bound_is_forwarded_untokenized(tmp_path: Path) -> None:
    out, got, tokenized = _run(tmp_path, "round_robin", [_chat("m-a", "hi")] * 3)
    assert [status for status, _ in out] == [200] * 3 and got == ["a"] * 3
    assert tokenized == 0


@pytest.mark.parametrize("max_tokens", [4, None])
def test_a_prompt_too_long_for_its_model_gets_a_clean_400(tmp_path: Path,
                                                         max_tokens: int | None) -> None:
    out, got, tokenized = _run(tmp_path, "round_robin",
                               [_chat("m-a", "x " * 200, max_tokens), _chat("m-a", "hi")])
    (status, answer), ok = out
    assert status == 400 and got == ["a"] and ok[0] == 200
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["code"] == "context_length_exceeded"
    assert f"has a context of {SHORT} tokens" in answer["error"]["message"]
    assert tokenized == 1  # the exact count, which the bound could not spare


def test_a_prompt_the_bound_does_not_clear_is_counted_exactly(tmp_path: Path) -> None:
    content = CODE * 4
    exact, bound = _tokens(content)
    assert exact + 4 <= SHORT < bound + 4  # fits, but only the exact count shows it
    out, got, tokenized = _run(tmp_path, "round_robin", [_chat("m-a", content)])
    assert out[0][0] == 200 and got == ["a"] and tokenized == 1


def test_auto_goes_only_to_a_model_whose_context_fits(tmp_path: Path) -> None:
    content = "x " * 100  # more than 64 tokens, fewer than 512
    assert SHORT < _tokens(content)[0] < LONG - 4
    out, got, tokenized = _run(tmp_path, "round_robin", [_chat("auto", content)] * 4)
    assert [status for status, _ in out] == [200] * 4 and got == ["b"] * 4
    assert tokenized == 4
    out, got, tokenized = _run(tmp_path, "round_robin", [_chat("auto", "hi")] * 4)
    assert sorted(got) == ["a", "a", "b", "b"] and tokenized == 0  # both fit, untokenized


def test_a_policy_that_reads_the_prompt_always_gets_it(tmp_path: Path) -> None:
    out, got, tokenized = _run(tmp_path, "filter", [_chat("m-a", "hi")] * 3)
    assert [status for status, _ in out] == [200] * 3 and got == ["a"] * 3
    assert tokenized == 3
