"""API keys (router.auth) and their use by the front, served on loopback in process (no
engine needed: every check runs before a request is parsed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from router.app import create_app
from router.auth import Keys, KeysError, bearer, load_keys
from router.config.cluster import ConfigError, load_cluster_config
from tests.front_server import served

ENGINE = ('[[engines]]\nname = "a"\nmodel = "builtin:tiny-a"\nport = 9301\n'
          'telemetry_endpoint = "ipc:///tmp/hs-auth-a.t"\nkv_events_endpoint = '
          '"ipc:///tmp/hs-auth-a.k"\n')


def test_keys_from_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keys").write_text("# clients\nk1\n\n  k2  \n")
    monkeypatch.setenv("HS_KEYS", "k3, k4,")
    assert load_keys(str(tmp_path / "keys"), "HS_KEYS", "x") == {"k1", "k2", "k3", "k4"}
    assert load_keys(None, None, "x") == frozenset()


@pytest.mark.parametrize("content, env, words", [
    (None, "HS_UNSET", "HS_UNSET is not set"),
    ("# none\n", None, "no key in"),
    ("a b\n", None, "spaces or control characters"),
    ("x" * 600 + "\n", None, "longer than 512"),
])
def test_unusable_keys_are_an_error(tmp_path: Path, content: str | None, env: str | None,
                                    words: str) -> None:
    file = None
    if content is not None:
        file = str(tmp_path / "keys")
        Path(file).write_text(content)
    with pytest.raises(KeysError, match=words):
        load_keys(file, env, "router API keys")
    with pytest.raises(KeysError, match="cannot read"):
        load_keys(str(tmp_path / "missing"), None, "router API keys")


def test_bearer_and_checks() -> None:
    assert bearer({"authorization": "Bearer  k1 "}) == "k1"
    assert bearer({"authorization": "Basic k1"}) is None and bearer({}) is None
    keys = Keys(frozenset({"k1"}), frozenset({"adm"}))
    keys.check_api({"authorization": "Bearer k1"})
    for headers in ({}, {"authorization": "Bearer k2"}, {"authorization": "Bearer \udc80"}):
        with pytest.raises(Exception) as info:
            keys.check_api(headers)
        assert info.value.status == 401 and info.value.code == "invalid_api_key"  # type: ignore
    assert keys.admin_allowed({"authorization": "Bearer adm"}, local=False)
    assert not keys.admin_allowed({"authorization": "Bearer k1"}, local=True)
    open_keys = Keys(frozenset(), frozenset())
    assert open_keys.check_api({}) is True
    assert keys.check_api({"authorization": "Bearer k1"}) is False
    both = Keys(frozenset({"k1"}), frozenset(), frozenset({"t1"}))
    assert both.check_api({"authorization": "Bearer t1"}) is True
    assert open_keys.admin_allowed({}, local=True) and not open_keys.admin_allowed({}, False)


def _load(tmp_path: Path, router_extra: str) -> Any:
    path = tmp_path / "cluster.toml"
    path.write_text('[router]\npolicy = "round_robin"\nport = 9300\n' + router_extra + ENGINE)
    return load_cluster_config(path)


def test_a_listener_beyond_loopback_needs_keys_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="router.host: '10.0.0.2' listens beyond loopback"):
        _load(tmp_path, 'host = "10.0.0.2"\n')
    assert _load(tmp_path, 'host = "10.0.0.2"\ninsecure = true\n').router.insecure
    cfg = _load(tmp_path, 'host = "0.0.0.0"\napi_keys_file = "keys.txt"\n')
    assert cfg.router.api_keys_file == str(tmp_path / "keys.txt")


Call = tuple[str, str, "dict[str, str] | None", "dict[str, Any] | None"]


def _calls(app: Any, calls: list[Call]) -> list[tuple[int, dict[str, Any]]]:
    """Each call's status and JSON body, through one served instance of ``app``."""
    async def go() -> list[tuple[int, dict[str, Any]]]:
        out = []
        async with served(app) as client:
            for method, path, headers, body in calls:
                async with client.request(method, path, headers=headers, json=body) as r:
                    out.append((r.status, await r.json()))
        return out
    return asyncio.run(go())


def test_the_front_asks_for_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "admin.txt").write_text("adm\n")
    monkeypatch.setenv("HS_API_KEYS", "k1")
    app = create_app(_load(tmp_path, 'api_keys_env = "HS_API_KEYS"\n'
                                     'admin_keys_file = "admin.txt"\n'))
    chat = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
    (s1, b1), (s2, b2), (s3, _), (s4, _), (s5, _), (s6, b6), (s7, b7), (s8, b8) = _calls(app, [
        ("POST", "/v1/chat/completions", None, chat),
        ("POST", "/v1/chat/completions", {"Authorization": "Bearer nope"}, chat),
        ("GET", "/v1/models", None, None),
        ("GET", "/v1/models", {"Authorization": "Bearer k1"}, None),
        ("POST", "/admin/engines/a-0/down", None, None),  # loopback too
        ("POST", "/admin/engines/a-0/down", {"Authorization": "Bearer adm"}, None),
        ("GET", "/health", None, None), ("GET", "/live", None, None)])
    # no key needed for either; with the only engine marked down the router is not ready
    # (503) but alive (200): a supervisor restarts on /live only
    assert s7 == 503 and b7["status"] == "no engine up"
    assert s8 == 200 and b8 == {"status": "alive"}
    assert s1 == 401 and b1["error"]["code"] == "invalid_api_key"
    assert s2 == 401 and "incorrect" in b2["error"]["message"]
    assert (s3, s4, s5) == (401, 200, 403)
    assert s6 == 200 and b6["up"] is False


def test_a_router_with_an_unset_key_variable_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match="HS_NOT_SET is not set"):
        create_app(_load(tmp_path, 'api_keys_env = "HS_NOT_SET"\n'))


def test_only_trusted_keys_rank_their_own_calls(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A trusted key's workflow position and priority reach the engine; another key's are
    dropped (counted), so "final stage" buys it nothing: the router ranks on its own."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    sent: list[int | None] = []

    async def engine(request: web.Request) -> web.Response:
        sent.append((await request.json()).get("priority"))
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"},
             "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                  "total_tokens": 4}})

    monkeypatch.setenv("HS_API_KEYS", "plain")
    monkeypatch.setenv("HS_TRUSTED", "agent")
    chat = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
    calls = [{**chat, "workflow": {"stage_index": 0, "num_stages": 50}},
             {**chat, "workflow": {"stage_index": 9, "num_stages": 10, "final": True}},
             {**chat, "priority": 7}]

    async def go() -> tuple[list[int | None], str]:
        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", engine)
        async with TestServer(engine_app, host="127.0.0.1") as eng:
            path = tmp_path / "c.toml"
            path.write_text(
                '[router]\npolicy = "chimera"\nport = 9398\nallow_client_priority = true\n'
                'api_keys_env = "HS_API_KEYS"\ntrusted_keys_env = "HS_TRUSTED"\n'
                '[router.policies.chimera]\nstatic_prior = true\n'
                'confidence = { tiny-a = 0.5 }\nmean_output_tokens = { tiny-a = 48 }\n'
                'decode_ms_per_token = { tiny-a = 2 }\nmax_batch_size = { tiny-a = 8 }\n'
                f'[[engines]]\nname = "a"\nurl = "http://127.0.0.1:{eng.port}"\n'
                'model = "builtin:tiny-a"\nserved_model_name = "tiny-a"\n'
                f'telemetry_endpoint = "ipc://{tmp_path}/a.t"\n'
                f'kv_events_endpoint = "ipc://{tmp_path}/a.k"\n')
            app = create_app(load_cluster_config(path))
            async with served(app) as client:
                for key in ("agent", "plain"):
                    for body in calls:
                        async with client.post("/v1/chat/completions", json=body,
                                               headers={"Authorization": f"Bearer {key}"}) as r:
                            assert r.status == 200, await r.text()
                metrics = await (await client.get("/metrics")).text()
        return sent, metrics

    priorities, metrics = asyncio.run(go())
    trusted, untrusted = priorities[:3], priorities[3:]
    assert trusted[0] is not None and trusted[1] is not None and trusted[0] > trusted[1]
    assert trusted[2] == 7
    assert len(set(untrusted)) == 1 and untrusted[0] != 7  # the same call, three times
    for name, n in (("stage_index", 2), ("num_stages", 2), ("final", 1), ("priority", 1)):
        assert f'hetserve_untrusted_fields_ignored_total{{field="{name}"}} {n}.0' in metrics
