"""The admin API fuzzed across two router workers (issue 35, item 3).

Two workers of one cluster (``router.workers = 2``) are served on loopback in one event
loop, linked by their real ZeroMQ ipc peer sockets (``router.dispatch.peers``).
Hypothesis draws sequences of ``POST /admin/engines/{instance}/{action}`` calls (up,
down, move, add, remove, and actions, names, URLs and bodies that are malformed,
oversized or repeated), one at a time, each to either worker. After every call no
answer may be a 5xx, and once the peer messages have arrived the two workers' engine
tables (names, URLs, down marks, nodes) and their telemetry subscriptions must be equal.
``HETSERVE_ADMIN_FUZZ_EXAMPLES`` sets the number of sequences (default 25).

Calls at once to different workers that conflict (a down to one, an up to the other; two
adds of one name with different URLs) are sent by ``test_conflicting_calls_at_once_converge``:
each change carries its engine's version (``router.state.engine_versions``), and both
workers must end with the one of the higher version, the one the answers name.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from urllib.parse import quote

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from router.app import FRONT, create_app
from router.config.cluster import parse_cluster_config
from tests.front_server import served

EXAMPLES = int(os.environ.get("HETSERVE_ADMIN_FUZZ_EXAMPLES", "25"))
KNOWN = ["a", "b", "c", "d"]
"""Engines of the cluster (a, b) and engines added by the calls (c, d)."""
ODD = ["", "a/b", "é", "x" * 300, "a%00"]
ACTIONS = ["up", "down", "move", "add", "remove", "bogus", ""]
URLS = ["http://127.0.0.1:9100", "http://127.0.0.1:9001/", "http://10.0.0.1:9100", "ftp://x",
        "http://127.0.0.1:0", "http://127.0.0.1:99999", "http://127.0.0.1:9100/v1",
        "http://u:p@127.0.0.1:9100", "not a url", "http://127.0.0.1:" + "9" * 400]
SETTLE_S = 10.0
"""Longest wait for the peer messages of a step to arrive (a bound, not a measurement)."""


def _config(tmp_path: Path) -> object:
    data = {"router": {"policy": "round_robin", "port": 8000, "workers": 2,
                       "sync_dir": str(tmp_path)},
            "engines": [_entry(tmp_path, name, port) for name, port in (("a", 9001),
                                                                         ("b", 9002))]}
    return parse_cluster_config(data, "test.toml", tmp_path)


def _entry(tmp_path: Path, name: str, port: int) -> dict[str, object]:
    return {"name": name, "url": f"http://127.0.0.1:{port}", "model": "builtin:tiny-a",
            "served_model_name": "tiny-a", "telemetry_endpoint": f"ipc://{tmp_path}/{name}.t",
            "kv_events_endpoint": f"ipc://{tmp_path}/{name}.kv"}


def _bodies(name: str) -> st.SearchStrategy[object]:
    """An engine's entry for ``name`` (completed by ``_post`` with its endpoints; some on a
    Ray node), or one that is wrong."""
    good = st.builds(lambda port, node: {"name": name, "url": f"http://127.0.0.1:{port}",
                                         "model": "builtin:tiny-a",
                                         "served_model_name": "tiny-a", "node": node},
                     st.integers(9100, 9110), st.sampled_from([None, "n1"]))
    return st.one_of(good, good, st.just({"name": "other"}), st.just([1, 2]),
                     st.just("x" * 70000),
                     st.just({"name": name, "url": "http://127.0.0.1:9100",
                              "served_model_name": "no-such-model"}),
                     st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                     max_size=4).map(lambda d: {**d, "name": name}))


@st.composite
def call(draw: st.DrawFn) -> tuple[int, str, str, dict[str, str], object]:
    worker = draw(st.integers(0, 1))
    name = draw(st.sampled_from(KNOWN) if draw(st.integers(0, 4)) else st.sampled_from(ODD))
    action = draw(st.sampled_from(ACTIONS))
    params: dict[str, str] = {}
    body: object = None
    if action == "move":
        params["url"] = draw(st.sampled_from(URLS))
        if draw(st.booleans()):
            params["node"] = draw(st.sampled_from(["n1", "x" * 600]))
    elif action in ("up", "down") and draw(st.booleans()):
        params["reason"] = draw(st.sampled_from(["launcher", "r" * 2000]))
    elif action == "add":
        body = draw(_bodies(name))
    return worker, name, action, params, body


steps = st.lists(call(), min_size=1, max_size=10)


def _table(app: object) -> dict[str, tuple[str, str | None, str | None]]:
    core = app[FRONT].core  # type: ignore[index]
    return {name: (e.url, e.marked_down, core.membership.nodes.get(name))
            for name, e in core.state.table.engines.items()}


def _subscriptions(app: object) -> tuple[set[str], set[str]]:
    m = app[FRONT].core.membership  # type: ignore[index]
    return ({i.telemetry_endpoint for i in m.instances.values()},
            {i.kv_events_endpoint for i in m.instances.values()})


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sequence=steps)
# found by this test: a reason or a name the peer messages could not carry was applied by
# the worker that got the call and dropped by the other
@example(sequence=[(0, "a", "down", {"reason": "r" * 2000}, None)])
@example(sequence=[(1, "x" * 300, "add", {}, {"model": "builtin:tiny-a", "url":
                                                "http://127.0.0.1:9100"}),
                   (1, "x" * 300, "down", {}, None)])
def test_admin_calls_leave_workers_agreeing(tmp_path_factory: object,
                                            sequence: list[tuple]) -> None:
    tmp_path = tmp_path_factory.mktemp("w")  # type: ignore[attr-defined]
    config = _config(tmp_path)

    async def go() -> None:
        apps = [create_app(config, worker=i) for i in (0, 1)]  # type: ignore[arg-type]
        async with served(apps[0]) as c0, served(apps[1]) as c1:
            clients = [c0, c1]
            await _joined(apps, clients)
            for step in sequence:
                w, name, action, params, body = step
                status = await _post(clients[w], name, action, params, body, tmp_path)
                assert status < 500, (step, status)
                deadline = time.monotonic() + SETTLE_S
                while _table(apps[0]) != _table(apps[1]) and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert _table(apps[0]) == _table(apps[1]), (step, status)
                assert _subscriptions(apps[0]) == _subscriptions(apps[1])
    asyncio.run(go())


async def _post(client: object, name: str, action: str, params: dict[str, str],
                body: object, tmp_path: Path | None = None) -> int:
    return (await _call(client, name, action, params, body, tmp_path))[0]


async def _call(client: object, name: str, action: str, params: dict[str, str],
                body: object, tmp_path: Path | None = None) -> tuple[int, object]:
    """The status and the JSON answer (None if not JSON) of one admin call."""
    path = f"/admin/engines/{quote(name, safe='')}/{quote(action, safe='')}"
    kwargs: dict[str, object] = {"params": params}
    if isinstance(body, dict) and "model" in body and tmp_path is not None:
        body = {**_entry(tmp_path, name, 0), **{k: v for k, v in body.items() if v}}
    if body is not None:
        kwargs["json"] = body
    async with client.post(path, **kwargs) as resp:  # type: ignore[attr-defined]
        data = await resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, None


TRIES = 10


def test_conflicting_calls_at_once_converge(tmp_path: Path) -> None:
    """A down to one worker and an up to the other sent together, then two adds of one
    name with different URLs, ``TRIES`` times each: once the peer messages have arrived
    both workers hold the same table, and it is the change with the higher version."""
    config = _config(tmp_path)

    async def go() -> None:
        apps = [create_app(config, worker=i) for i in (0, 1)]  # type: ignore[arg-type]
        async with served(apps[0]) as c0, served(apps[1]) as c1:
            await _joined(apps, [c0, c1])
            for i in range(TRIES):
                answers = await asyncio.gather(
                    _call(c0, "a", "down", {"reason": f"try {i}"}, None),
                    _call(c1, "a", "up", {}, None))
                winner = max(answers, key=lambda a: a[1]["version"])[1]  # type: ignore[index]
                await _settled(apps)
                assert _table(apps[0]) == _table(apps[1]), i
                assert _table(apps[0])["a"][1] == (None if winner["up"] else f"try {i}")
                answers = await asyncio.gather(*(
                    _call(c, f"n{i}", "add", {}, {"model": "builtin:tiny-a",
                                                  "url": f"http://127.0.0.1:{9200 + 2 * i + w}"},
                          tmp_path) for w, c in enumerate((c0, c1))))
                assert [a[0] for a in answers] == [200, 200], answers
                winner = max(answers, key=lambda a: a[1]["version"])[1]  # type: ignore[index]
                await _settled(apps)
                assert _table(apps[0]) == _table(apps[1]), i
                assert _table(apps[0])[f"n{i}"][0] == winner["url"]
                assert _subscriptions(apps[0]) == _subscriptions(apps[1])
    asyncio.run(go())


async def _settled(apps: list[object]) -> None:
    """Until the two workers' tables are equal (at most ``SETTLE_S``)."""
    deadline = time.monotonic() + SETTLE_S
    while _table(apps[0]) != _table(apps[1]) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _joined(apps: list[object], clients: list[object]) -> None:
    """Until each worker hears the other (a ZeroMQ subscription joins a little late)."""
    for sender, receiver in ((0, 1), (1, 0)):
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            await _post(clients[sender], "a", "down", {"reason": "join"}, None)
            await asyncio.sleep(0.05)
            if _table(apps[receiver])["a"][1] == "join":
                break
        await _post(clients[sender], "a", "up", {}, None)
    deadline = time.monotonic() + SETTLE_S
    while _table(apps[0]) != _table(apps[1]) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)



def test_removals_at_once_of_a_models_last_engines_converge(tmp_path: Path) -> None:
    """Two removals at once, to different workers, of a model's last two engines: each
    worker applies its own (the model still has the other engine there) and then the
    other's (a peer's removal is not refused as the last engine), so both end without the
    model's engines; a request for it gets a 503 with an OpenAI error, an add of another
    model under its name is refused, and an add of its own model brings it back in both."""
    config = _config(tmp_path)

    async def go() -> None:
        apps = [create_app(config, worker=i) for i in (0, 1)]  # type: ignore[arg-type]
        async with served(apps[0]) as c0, served(apps[1]) as c1:
            await _joined(apps, [c0, c1])
            for name in ("a", "b"):
                assert await _post(c0, name, "down", {}, None) == 200
            await _settled(apps)
            answers = await asyncio.gather(_call(c0, "b", "remove", {}, None),
                                           _call(c1, "a", "remove", {}, None))
            assert [a[0] for a in answers] == [200, 200], answers
            await _settled(apps)
            assert _table(apps[0]) == _table(apps[1]) == {}
            for client in (c0, c1):
                async with client.post("/v1/chat/completions", json={
                        "model": "tiny-a", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}]}) as resp:
                    body = await resp.json()
                    assert resp.status == 503, body
                    assert "has no engine" in body["error"]["message"]
                for path, expected in (("/v1/models", 200), ("/health", 503), ("/metrics", 200)):
                    async with client.get(path) as resp:  # /health: no engine is up
                        assert resp.status == expected, (path, await resp.text())
            status, body = await _call(c1, "d", "add", {}, {"model": "builtin:tiny-b",
                                                             "url": "http://127.0.0.1:9301"},
                                       tmp_path)  # the name's first model, not another
            assert status == 400 and "served by 'builtin:tiny-a'" in str(body), (status, body)
            status, _ = await _call(c1, "c", "add", {}, {"model": "builtin:tiny-a",
                                                         "url": "http://127.0.0.1:9300"},
                                    tmp_path)
            assert status == 200
            await _settled(apps)
            assert _table(apps[0]) == _table(apps[1])
            assert list(_table(apps[0])) == ["c"]
            assert _subscriptions(apps[0]) == _subscriptions(apps[1])
    asyncio.run(go())
