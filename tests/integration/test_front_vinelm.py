"""The ``vinelm`` policy inside the real router front, against the package's two real engines
(tests/tiny_pair.py; this module runs before test_router_front.py, which kills one):
per-call model choice over a program, objectives in the workflow metadata, 400s for bad
objectives and calls that do not fit the template, and the fallback for calls without an
objective."""

from __future__ import annotations

import sys
from typing import Any, Iterator

import httpx
import pytest

from tests.engine_proc import free_port, kill_group, spawn, wait_healthy
from tests.integration.test_router_front import MESSAGES, ROUTER_HEALTH_TIMEOUT_S
from tests.tiny_pair import ENGINE_KEY, TinyPair

pytestmark = pytest.mark.engine

POLICY = """
[router.policies.vinelm]
static_prior = true
fallback = "round_robin"
success = { tiny-a = 0.45, tiny-b = 0.7 }
cost_per_call = { tiny-a = 1.0, tiny-b = 4.0 }
latency_s_per_call = { tiny-a = 0.5, tiny-b = 1.5 }
decode_ms_per_token = { tiny-a = 2.5, tiny-b = 10.0 }
max_batch_size = { tiny-a = 8, tiny-b = 8 }

[router.policies.vinelm.workflows.solve]
stages = [
  { name = "solver", models = ["tiny-a", "tiny-b"], answers = true },
  { name = "verifier", models = ["tiny-a", "tiny-b"] },
]
loop = { from = "verifier", to = "solver", max_iterations = 1 }
"""


@pytest.fixture(scope="module")
def router_url(tiny_pair: TinyPair) -> Iterator[str]:
    tiny_pair.revive()
    d = tiny_pair.d
    router = None
    try:
        port = free_port()
        (d / "vinelm.toml").write_text("\n".join([
            "[router]", 'policy = "vinelm"', f"port = {port}", POLICY, tiny_pair.engines_toml()]))
        router = spawn([sys.executable, "-m", "router", "--config", str(d / "vinelm.toml")],
                       d / "vinelm-router.log", {ENGINE_KEY[0]: ENGINE_KEY[1]})
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, router, d / "vinelm-router.log", ROUTER_HEALTH_TIMEOUT_S)
        yield url
    finally:
        if router:
            kill_group(router)


def chat(url: str, workflow: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "auto", "messages": MESSAGES, "max_tokens": 4, "workflow": workflow})


def test_program_calls_follow_the_re_rooted_plan(router_url: str) -> None:
    obj = {"kind": "max_accuracy", "max_cost": 5}
    models = []
    for i, stage in enumerate(["solver", "verifier", "solver"]):
        r = chat(router_url, {"program_id": "p1", "workflow": "solve", "stage": stage,
                              "stage_index": i, "objective": obj})
        assert r.status_code == 200, r.text
        assert r.headers["x-hetserve-policy"] == "vinelm"
        assert r.json()["model"] == r.headers["x-hetserve-model"]
        models.append(r.headers["x-hetserve-model"])
    # cost 5: solve with b (4) and stop; then the cheapest continuations (a)
    assert models == ["tiny-b", "tiny-a", "tiny-a"]


def test_objective_errors_are_400s(router_url: str) -> None:
    r = chat(router_url, {"workflow": "solve", "objective": {"kind": "min_cost"}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "workflow.objective.min_accuracy"
    r = chat(router_url, {"program_id": "p2", "workflow": "solve", "stage": "verifier",
                          "stage_index": 0, "objective": {"kind": "min_cost",
                                                          "min_accuracy": 0.5}})
    assert r.status_code == 400 and "is stage 'solver'" in r.json()["error"]["message"]


def test_calls_without_objective_use_the_fallback(router_url: str) -> None:
    r = chat(router_url, {"program_id": "p3", "workflow": "solve", "stage": "solver"})
    assert r.status_code == 200 and r.headers["x-hetserve-policy"] == "round_robin"


def test_engine_executor_profiles_real_calls_through_the_router(router_url: str) -> None:
    from kernels_bench.lab.trace.suites import load_problems
    from kernels_bench.lab.vinelm.executors import EngineExecutor, Prices
    from router.vinelm.estimate import EstimationSettings, annotate
    from router.vinelm.profiling import cascade_sample
    from router.vinelm.template import parse_template

    t = parse_template("math", {"stages": [
        {"name": "solver", "models": ["tiny-a", "tiny-b"], "answers": True},
        {"name": "verifier", "models": ["tiny-a", "tiny-b"]}],
        "loop": {"from": "verifier", "to": "solver", "max_iterations": 1}})
    invs = t.invocations()
    problems = {p.id: p for p in load_problems("math", 4, 0)}
    prices = Prices({"tiny-a": 1.0, "tiny-b": 2.0}, {"tiny-a": 3.0, "tiny-b": 6.0})
    ex = EngineExecutor(router_url, "math", problems, invs, prices, max_tokens=8)
    try:
        obs = cascade_sample(ex, invs, list(problems), 4, seed=0)
    finally:
        ex.close()
    # every execution is a real call that continued from its parent's checkpoint
    assert obs.executions == len(ex.checkpoints) >= len(problems)
    for (problem, prefix), history in ex.checkpoints.items():
        assert [role for role, _ in history] == [inv.stage for inv in invs[:len(prefix)]]
        if len(prefix) > 1:
            assert history[:-1] == ex.checkpoints[problem, prefix[:-1]]
    assert obs.executed_cost > 0 and all(v > 0 for v in obs.latency_sum.values())
    annotate("math", invs, obs, EstimationSettings()).check_monotone()
