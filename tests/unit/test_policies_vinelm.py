"""The ``vinelm`` policy on a real router state: per-call choice, re-rooting on realised
latency, load-aware delays, fallback, and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.request import Workflow
from router.types import NoEngineAvailable, RoutingRequest
from router.vinelm.estimate import EstimationSettings, annotate
from router.vinelm.objective import Objective
from router.vinelm.profiling import cascade_sample
from router.vinelm.synthetic import default_env
from router.vinelm.template import parse_template
from router.vinelm.trie import save_tries
from tests.unit.test_policies_base import World

AB = ["a", "b"]
WORKFLOWS = {"solve": {"stages": [
    {"name": "solver", "models": AB, "answers": True}, {"name": "verifier", "models": AB}],
    "loop": {"from": "verifier", "to": "solver", "max_iterations": 2}}}
STATIC: dict[str, Any] = {
    "workflows": WORKFLOWS, "static_prior": True, "fallback": "lmetric",
    "success": {"a": 0.5, "b": 0.8}, "cost_per_call": {"a": 1.0, "b": 3.0},
    "latency_s_per_call": {"a": 1.0, "b": 2.0},
    "decode_ms_per_token": {"a": 1.0, "b": 1.0}, "max_batch_size": {"a": 1, "b": 1}}
# calls: solver, verifier, solver, verifier, solver
LATENCY = Objective("max_accuracy", max_latency_s=10.0)


def world() -> World:
    return World({"a-0": "a", "b-0": "b"})


def call(i: int, stage: str, at: float, objective: Objective | None = LATENCY,
         program: str = "p", **kw: Any) -> RoutingRequest:
    return RoutingRequest(request_id=f"{program}-{i}", requested_model=None, arrival_time=at,
                          workflow=Workflow(program_id=program, workflow="solve",
                                                stage=stage, stage_index=i,
                                                objective=objective, **kw))


def test_each_call_is_chosen_on_the_re_rooted_trie() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    d0 = w.decide(policy, call(0, "solver", 100.0))
    # within 10 s the most accurate plan solves with b three times (2 + 1 + 2 + 1 + 2 s);
    # verifiers never answer, so the cheaper a checks
    assert d0.model == "b" and d0.info["plan"] == ["b", "a", "b", "a", "b"]
    assert d0.info["feasible"] and d0.info["expected_latency_s"] == pytest.approx(8.0)
    d1 = w.decide(policy, call(1, "verifier", 102.0))        # the solver took 2 s
    assert d1.model == "a" and d1.info["depth"] == 1
    assert d1.info["plan"] == ["b", "a", "b", "a", "b"]
    # the verifier took 6 s instead of 1: 9 s used, one more a-solve fits, b does not
    d2 = w.decide(policy, call(2, "solver", 109.0))
    assert d2.model == "a" and d2.info["plan"] == ["b", "a", "a"]
    assert d2.info["expected_latency_s"] == pytest.approx(10.0)


def test_slow_stage_switches_the_suffix_of_the_plan() -> None:
    obj = Objective("max_accuracy", max_latency_s=6.0)
    on_time, slow = world(), world()
    p_on, p_slow = on_time.build("vinelm", STATIC), slow.build("vinelm", STATIC)
    for w, p in ((on_time, p_on), (slow, p_slow)):
        d = w.decide(p, call(0, "solver", 100.0, obj))
        assert d.model == "b" and d.info["plan"] == ["b", "a", "b"]
    assert on_time.decide(p_on, call(1, "verifier", 102.0, obj)).info["plan"] == \
        ["b", "a", "b"]
    assert on_time.decide(p_on, call(2, "solver", 103.0, obj)).model == "b"
    late = slow.decide(p_slow, call(1, "verifier", 103.5, obj))   # 3.5 s, 2 expected
    assert late.info["plan"] == ["b", "a", "a"] and late.info["feasible"]
    assert slow.decide(p_slow, call(2, "solver", 104.5, obj)).model == "a"


def test_without_re_rooting_a_late_program_keeps_its_first_plan() -> None:
    w = world()
    policy = w.build("vinelm", {**STATIC, "reroot": False})
    assert w.decide(policy, call(0, "solver", 100.0)).info["plan"] == ["b", "a", "b", "a", "b"]
    assert w.decide(policy, call(1, "verifier", 102.0)).model == "a"
    # 9 s used (as in the re-rooted test above, which switches to a): the root plan holds
    late = w.decide(policy, call(2, "solver", 109.0))
    assert late.model == "b" and late.info["plan"] == ["b", "a", "b", "a", "b"]
    assert late.info["expected_latency_s"] == pytest.approx(8.0)  # the plan's, at the root


def test_load_delay_of_a_busy_engine_moves_the_call() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    obj = Objective("max_accuracy", max_latency_s=3.0)
    assert w.decide(policy, call(0, "solver", 100.0, obj, program="idle")).model == "b"
    w.load("b-0", batch=1, decode=2500)     # D = 2500 x 1 ms / 1 = 2.5 s on b
    busy = w.decide(policy, call(0, "solver", 100.0, obj, program="busy"))
    assert busy.model == "a" and busy.info["delay_s"] == 0.0


def test_min_cost_objective_and_num_stages() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    obj = Objective("min_cost", min_accuracy=0.7)
    # b alone (0.8, cost 3) ties a, verifier a, a (0.75, cost 3) on cost, wins on accuracy
    assert w.decide(policy, call(0, "solver", 100.0, obj)).info["plan"] == ["b"]
    # a client that will run 3 calls: the plan must stop at depth 3
    d = w.decide(policy, call(0, "solver", 100.0, obj, program="q", num_stages=3))
    assert len(d.info["plan"]) == 3


def test_requests_without_objective_go_to_the_fallback() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    d = w.decide(policy, call(0, "solver", 100.0, objective=None))
    assert d.policy == "lmetric"


@pytest.mark.parametrize("req,needle", [
    (call(0, "verifier", 100.0), "call 0 of workflow 'solve' is stage 'solver'"),
    (call(5, "solver", 100.0), "beyond its longest run"),
    (call(2, "solver", 100.0, program="new"), "has no record of its calls before call 2"),
])
def test_calls_that_do_not_fit_the_template_are_errors(req: RoutingRequest,
                                                       needle: str) -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    with pytest.raises(ValueError, match=needle):
        w.decide(policy, req)


def test_unknown_workflow_is_an_error() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    r = RoutingRequest("r", None, workflow=Workflow(workflow="other", objective=LATENCY))
    with pytest.raises(ValueError, match="'other' has no VineLM template"):
        w.decide(policy, r)


@pytest.mark.parametrize("settings,needle", [
    ({"workflows": WORKFLOWS, "fallback": "lmetric"}, "needs annotated tries"),
    ({**STATIC, "decode_ms_per_token": {}}, "needs the decode profile of a"),
    ({**STATIC, "workflows": {"x": {"stages": [{"name": "s", "models": ["z"],
                                                "answers": True}]}}},
     "no value for z"),
    ({**STATIC, "fallback": "nope"}, "unknown policy 'nope'"),
    ({**STATIC, "workflows": {}}, "needs workflow templates"),
])
def test_start_up_errors_say_what_to_do(settings: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        world().build("vinelm", settings)


def test_policy_loads_a_profiled_trie(tmp_path: Path) -> None:
    t = parse_template("solve", WORKFLOWS["solve"])
    invs = t.invocations()
    obs = cascade_sample(default_env(invs), invs, [f"x{i}" for i in range(300)], 1, 0)
    path = tmp_path / "tries.json"
    save_tries(path, {"solve": annotate("solve", invs, obs, EstimationSettings()).to_json(
        t, {})})
    w = world()
    policy = w.build("vinelm", {"workflows": WORKFLOWS, "profile_path": str(path),
                                "fallback": "lmetric", "load_aware": False})
    assert policy.sources["trie"] == "profile"
    d = w.decide(policy, call(0, "solver", 100.0, Objective("max_accuracy", max_cost=1e9)))
    assert d.model in AB and len(d.info["plan"]) >= 1


def test_a_restarted_program_gets_a_fresh_clock() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    obj = Objective("max_accuracy", max_latency_s=6.0)
    w.decide(policy, call(0, "solver", 100.0, obj))
    w.decide(policy, call(1, "verifier", 150.0, obj))      # very late: 50 s elapsed
    w.decide(policy, call(0, "solver", 200.0, obj))        # the program id starts again
    d = w.decide(policy, call(1, "verifier", 202.0, obj))
    assert d.info["feasible"] and d.info["plan"] == ["b", "a", "b"]


def test_no_admissible_engine_is_no_engine_available() -> None:
    w = world()
    policy = w.build("vinelm", STATIC)
    with pytest.raises(NoEngineAvailable, match="no admissible model of stage 'solver'"):
        policy.decide(call(0, "solver", 100.0), [], w.view(), None)
