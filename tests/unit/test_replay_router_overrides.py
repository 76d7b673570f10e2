"""The router side of the replay contract: ``per_model`` max_tokens and priority."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from router.admission.parse import parse_request
from router.proxy import upstream_body
from router.request import RequestError

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
        "per_model": {"max_tokens": {"a": 12, "b": 40}, "priority": {"a": 30, "b": 90}}}


def parse(body: dict[str, Any], allow: bool = False) -> Any:
    return parse_request("chat", json.dumps(body).encode(), {}, allow_client_priority=allow)


def test_per_model_values_parsed_priority_only_when_allowed() -> None:
    p = parse(BODY)
    assert p.model_max_tokens == {"a": 12, "b": 40} and p.model_priority == {}
    assert parse(BODY, allow=True).model_priority == {"a": 30, "b": 90}
    assert parse({"messages": BODY["messages"]}).model_max_tokens == {}


def test_per_model_never_reaches_the_engine() -> None:
    sent = json.loads(upstream_body(parse(BODY, allow=True), "a", 30, 12))
    assert "per_model" not in sent and sent["max_tokens"] == 12 and sent["priority"] == 30


@pytest.mark.parametrize("per_model, param", [
    ([], "per_model"),
    ({"min_tokens": {}}, "per_model.min_tokens"),
    ({"max_tokens": [1]}, "per_model.max_tokens"),
    ({"max_tokens": {"a": 0}}, "per_model.max_tokens.a"),
    ({"max_tokens": {"a": "5"}}, "per_model.max_tokens.a"),
    ({"priority": {"a": -1}}, "per_model.priority.a"),
    ({"priority": {"a": 2**31}}, "per_model.priority.a"),
])
def test_bad_per_model_rejected(per_model: Any, param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse({**BODY, "per_model": per_model})
    assert info.value.status == 400 and info.value.param == param


# ---------------------------------------------------------------- through the HTTP front


def front_config(tmp_path: Path) -> Any:
    from router.config.cluster import load_cluster_config

    engines = "".join(
        f'[[engines]]\nname = "{m}"\nmodel = "builtin:{m}"\nport = {port}\n'
        f'telemetry_endpoint = "ipc://{tmp_path}/{m}.t"\n'
        f'kv_events_endpoint = "ipc://{tmp_path}/{m}.k"\n'
        for m, port in (("tiny-a", 9311), ("tiny-b", 9312)))
    (tmp_path / "c.toml").write_text('[router]\npolicy = "round_robin"\nport = 9310\n'
                                     + engines)
    return load_cluster_config(tmp_path / "c.toml")


@pytest.mark.parametrize("per_model, status, code, param, words", [
    ({"max_tokens": {"tiny-c": 5}}, 400, "model_not_found", "per_model.max_tokens",
     "names model 'tiny-c', which is not served here; served models: tiny-a, tiny-b"),
    ({"priority": {"gpt-9": 5}}, 400, "model_not_found", "per_model.priority", "'gpt-9'"),
    ({"max_tokens": {"tiny-a": -3}}, 400, "invalid_value", "per_model.max_tokens.tiny-a",
     "must be >= 1, got -3"),
    ({"max_tokens": {"tiny-a": None}}, 400, "invalid_type", "per_model.max_tokens.tiny-a",
     "must be an integer"),
    ("fast", 400, "invalid_type", "per_model", "'per_model' must be an object"),
])
def test_front_answers_bad_per_model_with_a_400(tmp_path: Path, per_model: Any, status: int,
                                                code: str, param: str, words: str) -> None:
    """The router answers before tokenizing or routing: an OpenAI error object, no
    traceback (no engine needed: the request never gets that far)."""
    from router.app import create_app
    from tests.front_server import served

    app = create_app(front_config(tmp_path))

    async def post() -> tuple[int, dict[str, Any], str]:
        async with served(app) as client:
            async with client.post("/v1/chat/completions", json={
                    "model": "auto", "messages": [{"role": "user", "content": "hi"}],
                    "per_model": per_model}) as r:
                text = await r.text()
                return r.status, json.loads(text), text

    got_status, got, text = asyncio.run(post())
    error = got["error"]
    assert (got_status, error["code"], error["param"]) == (status, code, param), error
    assert words in error["message"] and "Traceback" not in text
