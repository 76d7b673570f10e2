"""The ``online`` policy and its outcome path (issue 59): the book's verdicts (accepted,
duplicate, unknown, late) and single credits, retries' failures, forgetting, the state
written atomically and restored (a restart loses nothing), the policy learning which
programs need the big model while holding the target share, and the outcome route on the
real app (keys, bounds, verdicts, the Prometheus counter), fuzzed with 0 5xx."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.app import FRONT, create_app
from router.config.cluster import load_cluster_config
from router.policies.online import Online, OnlineSettings
from router.policies.registry import build_policy, validate_settings
from router.predictors.base import PredictorSet
from router.request import Workflow
from router.settings import SettingsError
from router.state.outcomes import OutcomeBook, context_key
from router.types import RoutingRequest
from tests.front_server import served
from tests.unit.test_policies_base import World

ENGINES = {"a": "tiny-a", "b": "tiny-b"}
FAST = {"decode_ms_per_token": {"tiny-a": 1.0, "tiny-b": 4.0}}


def online(tmp: Path | None = None, **kw: Any) -> Online:
    table = {**FAST, **kw}
    if tmp is not None:
        table["state_file"] = str(tmp / "online.json")
    policy = build_policy("online", {"online": table}, World(ENGINES).cluster, PredictorSet())
    assert isinstance(policy, Online)
    return policy


def req(pid: str, workflow: str = "w", n: int = 100, stage_index: int = 0,
        tried: tuple[str, ...] = ()) -> RoutingRequest:
    return RoutingRequest(pid + str(stage_index) + "".join(tried), None,
                          num_prompt_tokens=n, workflow=Workflow(
                              program_id=pid, workflow=workflow, stage_index=stage_index,
                              tried_models=tried))


# -- the book ---------------------------------------------------------------------------


def test_book_verdicts_credit_each_call_once() -> None:
    book = OutcomeBook(max_programs=2)
    ctx = context_key("w", "0", 3)
    book.note("p1", "0", ctx, "tiny-b")
    before = book.arm(ctx, "tiny-b").alpha
    assert book.report("p1", None, 1.0) == "accepted"
    assert book.arm(ctx, "tiny-b").alpha == pytest.approx(before + 1)
    assert book.report("p1", None, 1.0) == "duplicate"
    assert book.report("p1", "0", 0.0) == "duplicate"  # the same call, by its stage
    assert book.arm(ctx, "tiny-b").alpha == pytest.approx(before + 1)
    assert book.report("p1", "7", 1.0) == "unknown"  # a stage never routed
    assert book.report("nobody", None, 1.0) == "unknown"
    book.note("p2", "0", ctx, "tiny-a")
    book.note("p3", "0", ctx, "tiny-a")  # p1 forgotten (two programs kept)
    assert book.report("p1", None, 1.0) == "late"
    assert book.counts == {"accepted": 1, "duplicate": 2, "unknown": 2, "late": 1,
                           "retry_failure": 0}


def test_book_retry_fails_tried_models_once_and_parent_learns() -> None:
    book = OutcomeBook()
    ctx = context_key("w", "0", 3)
    book.note("p", "0", ctx, "tiny-a")
    assert book.retry("p", "0", ctx, ["tiny-a"]) == 1
    assert book.retry("p", "0", ctx, ["tiny-a"]) == 0  # the second retry names it again
    assert book.arm(ctx, "tiny-a").beta == pytest.approx(1 + 1)
    assert book.arm(context_key("w", None, None), "tiny-a").beta == pytest.approx(2)
    # a new bucket of the workflow starts from the workflow's mean
    assert book.arm(context_key("w", "0", 9), "tiny-a").mean == pytest.approx(1 / 3)


def test_book_forgets_past_memory() -> None:
    book = OutcomeBook(memory=10)
    ctx = context_key("w", "0", 1)
    for i in range(100):
        book.note(f"p{i}", "0", ctx, "m")
        book.report(f"p{i}", None, 1.0)
    a = book.arm(ctx, "m")
    assert a.alpha + a.beta == pytest.approx(10)
    for i in range(100, 130):  # the workload changes: it relearns
        book.note(f"p{i}", "0", ctx, "m")
        book.report(f"p{i}", None, 0.0)
    assert book.arm(ctx, "m").mean < 0.1


def test_book_state_round_trips_and_refuses_garbage(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    book = OutcomeBook(str(path))
    ctx = context_key("w", "0", 2)
    book.note("p", "0", ctx, "m")
    book.note("q", "0", ctx, "m")
    book.report("p", None, 0.25)
    again = OutcomeBook(str(path))
    assert again.arms == book.arms and again.counts == book.counts
    assert again.report("p", None, 1.0) == "duplicate"
    assert again.report("q", None, 1.0) == "accepted"  # routed before the restart
    assert not list(tmp_path.glob("s.json.*"))  # no temporary left behind
    path.write_text('{"format": 1, "arms": [["c", "m", -1, 2]]}')
    with pytest.raises(ValueError, match="unreadable"):
        OutcomeBook(str(path))
    path.write_text("not json")
    with pytest.raises(ValueError, match="unreadable"):
        OutcomeBook(str(path))


# -- the policy -------------------------------------------------------------------------


def test_settings_are_bounded() -> None:
    with pytest.raises(SettingsError):
        validate_settings("online", {"target_share": 1.0})
    with pytest.raises(SettingsError):
        validate_settings("online", {"memory": 1})
    with pytest.raises(SettingsError):
        validate_settings("online", {"priors": {"tiny-a": 0.0}})
    with pytest.raises(SettingsError):
        validate_settings("online", {"explore": 0.0})
    with pytest.raises(SettingsError):
        validate_settings("online", {"share_correction": -1.0})
    assert isinstance(validate_settings("online", {}), OnlineSettings)


def test_explore_scales_the_draw_around_the_posterior_mean() -> None:
    """q = mean + explore x (Beta draw - mean): explore 1 is the plain draw; a small one
    keeps q within explore of the mean, so the mean ranks the programs."""
    post = {"tiny-a": (3.0, 7.0), "tiny-b": (6.0, 4.0)}
    for explore in (1.0, 0.5, 0.02):
        policy = online(explore=explore, seed=5)
        draws = random.Random(5)
        plain = {m: draws.betavariate(a, b) for m, (a, b) in post.items()}
        q = policy._draws(post)
        for m, (a, b) in post.items():
            mean = a / (a + b)
            assert q[m] == pytest.approx(mean + explore * (plain[m] - mean))
    small = online(explore=0.02)
    assert all(small._draws(post)["tiny-b"] > small._draws(post)["tiny-a"] for _ in range(50))


def test_share_holds_while_the_gains_climb() -> None:
    """A learner's gains climb faster than the quantile's window follows: with
    ``share_correction`` 0 (Chimera's quantile alone) nearly every call goes past the fast
    model; the correction leans it back toward the target (a proportional hold: a steady
    climb still leaves some excess), and on steady gains both hold the target."""
    from router.policies.online import ShareHold

    def share(correction: float, climb: float = 1 / 1000) -> float:
        hold, went = ShareHold(0.3, 50, correction), []
        rng = random.Random(0)
        for i in range(1000):
            gain = i * climb + 0.05 * rng.random()  # climbing, as a learner's means do
            past = gain >= hold.next(gain)
            hold.went(past)
            went.append(past)
        return sum(went[100:]) / 900

    assert share(0.0) > 0.7
    assert share(1.0) < 0.5
    assert 0.25 < share(0.0, 0.0) < 0.35 and 0.25 < share(1.0, 0.0) < 0.35


def simulate(policy: Online, world: World, programs: range, need_big: float = 0.3,
             seed: int = 1) -> tuple[list[bool], list[bool]]:
    """Programs of two kinds, short (never need the big model) and long (need it with
    probability ``need_big``x3), each outcome reported as it ends; whether each went big,
    and whether it passed."""
    rng = random.Random(seed)
    went, passed = [], []
    for i in programs:
        long = rng.random() < 1 / 3
        r = req(f"p{i}", n=3000 if long else 30)
        model = policy.decide(r, world.cands(), world.view(), None).model
        ok = model == "tiny-b" or not long or rng.random() > need_big * 3
        policy.book.report(f"p{i}", None, float(ok))
        went.append(model == "tiny-b")
        passed.append(ok)
    return went, passed


def test_learns_which_programs_need_the_big_model_at_its_share() -> None:
    world = World(ENGINES)
    policy = online(target_share=0.3, neighbours=0)
    went, passed = simulate(policy, world, range(1500))
    share = sum(went[500:]) / 1000
    assert 0.24 < share < 0.36, share  # the target holds
    # after learning, the big model's calls are the long programs'
    long_big = policy.book.arm(policy.context(req("x", n=3000)), "tiny-b").mean
    long_small = policy.book.arm(policy.context(req("x", n=3000)), "tiny-a").mean
    assert long_big > long_small + 0.3
    late = sum(passed[1000:]) / 500
    rnd = 1 - (1 / 3) * 0.9 * (1 - 0.3)  # random mix at 0.3: P(pass)
    assert late > rnd + 0.1, (late, rnd)


TEMPLATES = ["A train leaves {c} at {n} km per hour toward the coast; when does it arrive?",
             "Write the word {c} backwards and count its vowels after {n} rotations."]
CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Delhi", "Perth", "Accra"]


def templated(policy: Online, world: World, n: int, seed: int = 0) -> list[float]:
    """Programs of two templates of one length: the first needs the big model (it fails on
    the small one), the second passes anywhere; per program, whether it passed."""
    rng = random.Random(seed)
    passed = []
    for i in range(n):
        t = rng.random() < 0.3
        text = TEMPLATES[0 if t else 1].format(c=rng.choice(CITIES), n=rng.randint(2, 99))
        r = RoutingRequest(f"r{i}", None, user_text=text, prompt_text=text,
                           num_prompt_tokens=20, workflow=Workflow(
                               program_id=f"p{i}", workflow="w", stage_index=0))
        model = policy.decide(r, world.cands(), world.view(), None).model
        ok = model == "tiny-b" or not t
        policy.book.report(f"p{i}", None, float(ok))
        passed.append(float(ok))
    return passed


def test_neighbours_tell_templates_of_one_length_apart() -> None:
    """The context arms cannot (one workflow, one length bucket); the nearest credited
    prompts can: after 300 programs nearly every big-model call is the first template's."""
    with_nb = templated(online(target_share=0.3, neighbours=10), World(ENGINES), 600)
    arms = templated(online(target_share=0.3, neighbours=0), World(ENGINES), 600)
    late_nb, late_arms = sum(with_nb[300:]) / 300, sum(arms[300:]) / 300
    assert late_nb > 0.95 and late_nb > late_arms + 0.1, (late_nb, late_arms)


def test_similarity_is_the_cosine_over_words_that_are_not_stop_words() -> None:
    policy = online(neighbours=5)
    nb = policy.lexical
    assert nb is not None
    rng = random.Random(0)
    words = ["apple", "pear", "sold", "clips", "friends", "many", "how", "did", "rain"]
    texts = [" ".join(rng.choice(words) + str(rng.randint(0, 9)) * (i % 2) + rng.choice(
        "abcdefgh") * 2 for _ in range(10)) for i in range(80)]
    for i, t in enumerate(texts):
        policy.book.note(f"p{i}", "0", "c", "tiny-a", nb.features(t))
        policy.book.report(f"p{i}", None, 1.0)
    nb._reindex()
    keep = ~nb.stop

    def dense(t: str) -> Any:
        import numpy as np
        i, v = nb.features(t)
        x = np.bincount(np.asarray(i), weights=np.asarray(v), minlength=keep.size) * keep
        return x / max(float(np.sqrt(x @ x)), 1e-9)

    q = texts[3]
    expect = [float(dense(t) @ dense(q)) for t in texts]
    assert nb._similarity(nb.features(q)) == pytest.approx(expect, abs=1e-6)
    assert expect[3] == pytest.approx(1.0)


def test_retry_goes_to_an_untried_model_and_teaches_a_failure() -> None:
    world = World(ENGINES)
    policy = online()
    first = policy.decide(req("p"), world.cands(), world.view(), None).model
    retry = policy.decide(req("p", tried=(first,)), world.cands(), world.view(), None)
    assert retry.model != first
    assert policy.book.counts["retry_failure"] == 1
    assert policy.book.arm(policy.context(req("p")), first).beta > 1.0


def test_restart_mid_run_loses_no_learned_state(tmp_path: Path) -> None:
    world = World(ENGINES)
    policy = online(tmp_path, seed=3)
    simulate(policy, world, range(300))
    pending = req("open")
    policy.decide(pending, world.cands(), world.view(), None)  # routed, no outcome yet
    simulate(policy, world, range(300, 302))  # a credit writes the state
    arms = {k: (a.alpha, a.beta) for k, a in policy.book.arms.items()}
    counts = dict(policy.book.counts)
    examples = [(e.indices.tolist(), e.values.tolist(), e.model, e.score)
                for e in policy.book.examples]
    assert len(examples) > 300
    restarted = online(tmp_path, seed=3)
    assert {k: (a.alpha, a.beta) for k, a in restarted.book.arms.items()} == arms
    assert [(e.indices.tolist(), e.values.tolist(), e.model, e.score)
            for e in restarted.book.examples] == examples
    assert restarted.book.counts == counts
    assert restarted.book.report("open", None, 1.0) == "accepted"
    assert restarted.book.report("p5", None, 1.0) == "duplicate"


# -- the route on the real app ----------------------------------------------------------


def cluster(tmp_path: Path, ports: tuple[int, int], extra: str = "") -> Any:
    (tmp_path / "c.toml").write_text(
        f'[router]\npolicy = "online"\nport = 9323\n{extra}'
        f'[router.policies.online]\nstate_file = "{tmp_path}/online.json"\n'
        'decode_ms_per_token = { tiny-a = 1.0, tiny-b = 4.0 }\n'
        + "".join(f'[[engines]]\nname = "{n}"\nurl = "http://127.0.0.1:{port}"\n'
                  f'model = "builtin:{m}"\nserved_model_name = "{m}"\n'
                  f'telemetry_endpoint = "ipc://{tmp_path}/{n}.t"\n'
                  f'kv_events_endpoint = "ipc://{tmp_path}/{n}.k"\n'
                  for (n, m), port in zip(ENGINES.items(), ports)))
    return load_cluster_config(tmp_path / "c.toml")


ANSWER = {"id": "x", "object": "chat.completion", "choices": [],
          "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}


async def engine() -> TestServer:
    async def chat(request: web.Request) -> web.Response:
        return web.json_response({**ANSWER, "model": (await request.json())["model"]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return TestServer(app, host="127.0.0.1")


def chat(pid: str, tried: list[str] | None = None) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "add 2 and 3"}],
            "max_tokens": 4, "workflow": {"program_id": pid, "workflow": "math",
                                          "tried_models": tried or []}}


def test_outcome_route_on_the_real_app(tmp_path: Path) -> None:
    async def go() -> None:
        async with await engine() as e1, await engine() as e2:
            app = create_app(cluster(tmp_path, (e1.port, e2.port)))
            async with served(app) as client:
                async with client.post("/v1/chat/completions", json=chat("p1")) as r:
                    assert r.status == 200
                    first = (await r.json())["model"]
                verdicts = []
                for body in ({"program_id": "p1", "passed": True},
                             {"program_id": "p1", "passed": False},
                             {"program_id": "p9", "score": 0.5}):
                    async with client.post("/v1/hetserve/outcomes", json=body) as r:
                        assert r.status == 200
                        verdicts.append((await r.json())["verdict"])
                assert verdicts == ["accepted", "duplicate", "unknown"]
                for bad in (b"{", b'{"program_id": "p1"}',
                            b'{"program_id": "p1", "passed": true, "score": 1}',
                            b'{"program_id": "p1", "score": 1.5}',
                            b'{"program_id": "", "passed": true}',
                            b'{"program_id": "p1", "passed": true, "extra": 1}',
                            json.dumps({"program_id": "x" * 2000, "passed": True}).encode(),
                            b"[" * 5000):
                    async with client.post("/v1/hetserve/outcomes", data=bad) as r:
                        assert r.status in (400, 413), (bad[:40], r.status)
                        assert "error" in await r.json()
                # a retry names the first model: a failure for it, once
                async with client.post("/v1/chat/completions",
                                       json=chat("p2", [first])) as r:
                    assert r.status == 200
                    assert (await r.json())["model"] != first
                async with client.get("/metrics") as r:
                    text = await r.text()
                assert 'hetserve_outcomes_total{verdict="accepted"} 1.0' in text
                assert 'hetserve_outcomes_total{verdict="duplicate"} 1.0' in text
                assert 'hetserve_outcomes_total{verdict="retry_failure"} 1.0' in text
                assert 'hetserve_outcomes_total{verdict="invalid"} 8.0' in text
            saved = json.loads((tmp_path / "online.json").read_text())
            assert saved["counts"]["accepted"] == 1
    asyncio.run(go())


def test_outcome_route_needs_the_api_key(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("sk-1\n")

    async def go() -> None:
        async with await engine() as e1, await engine() as e2:
            app = create_app(cluster(tmp_path, (e1.port, e2.port),
                                     f'api_keys_file = "{tmp_path}/keys"\n'))
            async with served(app) as client:
                body = {"program_id": "p", "passed": True}
                async with client.post("/v1/hetserve/outcomes", json=body) as r:
                    assert r.status == 401
                async with client.post("/v1/hetserve/outcomes", json=body,
                                       headers={"authorization": "Bearer sk-1"}) as r:
                    assert r.status == 200 and (await r.json())["verdict"] == "unknown"
    asyncio.run(go())


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(), st.text(max_size=40),
                    st.sampled_from(["p0", "p1", "", "0", 10**400, 1.0, 0.0]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
valid = st.one_of(
    st.fixed_dictionaries({"program_id": st.sampled_from(["p0", "p1", "nobody"]),
                           "passed": st.booleans()}, optional={"stage": st.just("0")}),
    st.fixed_dictionaries({"program_id": st.sampled_from(["p0", "p1", "nobody"]),
                           "score": st.floats(0, 1)}))
bodies = st.one_of(
    valid, valid,
    st.fixed_dictionaries({"program_id": st.sampled_from(["p0", "p1", "nobody"])},
                          optional={"stage": values, "passed": values, "score": values}),
    st.dictionaries(st.sampled_from(["program_id", "stage", "passed", "score", "x"]),
                    values, max_size=4), values)
raw = st.one_of(bodies.map(lambda b: json.dumps(b).encode()), st.binary(max_size=100))


def test_outcome_route_fuzzed_never_5xx_never_double_counts(tmp_path: Path) -> None:
    async def go() -> None:
        async with await engine() as e1, await engine() as e2:
            app = create_app(cluster(tmp_path, (e1.port, e2.port)))
            async with served(app) as client:
                for pid in ("p0", "p1"):
                    async with client.post("/v1/chat/completions", json=chat(pid)) as r:
                        assert r.status == 200
                statuses: dict[int, int] = {}

                @settings(max_examples=400, derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(raw, st.sampled_from(["POST", "POST", "GET", "PUT"]))
                def one(data: bytes, method: str) -> None:
                    status = asyncio.run_coroutine_threadsafe(
                        send(method, data), loop).result(60)
                    statuses[status] = statuses.get(status, 0) + 1

                async def send(method: str, data: bytes) -> int:
                    async with client.request(method, "/v1/hetserve/outcomes",
                                              data=data) as r:
                        await r.read()
                        return r.status

                loop = asyncio.get_running_loop()
                await asyncio.to_thread(one)
                assert not [s for s in statuses if s >= 500], statuses
                assert statuses.get(200, 0) > 20 and statuses.get(400, 0) > 20, statuses
                book = app[FRONT].core.routing.policy.book  # type: ignore[attr-defined]
                assert book.counts["accepted"] <= 2  # one call each, however often told
                print(f"outcome fuzz: statuses {sorted(statuses.items())}, {book.counts}")
    asyncio.run(go())
