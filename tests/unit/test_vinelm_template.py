"""VineLM workflow templates: the unrolled run, tool stages, errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.cluster import ConfigError, parse_cluster_config
from router.policies.registry import validate_settings
from router.vinelm.template import parse_template

AB = ["a", "b"]
MATH: dict[str, Any] = {
    "stages": [{"name": "planner", "models": AB}, {"name": "solver", "models": AB,
                                                  "answers": True},
               {"name": "verifier", "models": AB}],
    "loop": {"from": "verifier", "to": "solver", "max_iterations": 1}}


def test_math_loop_unrolls_to_the_trace_workflow() -> None:
    t = parse_template("math", MATH)
    assert [i.stage for i in t.invocations()] == ["planner", "solver", "verifier", "solver"]
    assert [i.answers for i in t.invocations()] == [False, True, False, True]
    three = parse_template("math", {**MATH, "loop": {**MATH["loop"], "max_iterations": 3}})
    assert [i.stage for i in three.invocations()] == \
        ["planner"] + ["solver", "verifier"] * 3 + ["solver"]
    none = parse_template("math", {**MATH, "loop": {**MATH["loop"], "max_iterations": 0}})
    assert [i.stage for i in none.invocations()] == ["planner", "solver"]


def test_tool_stages_fold_into_the_next_call_or_the_last() -> None:
    t = parse_template("code", {"stages": [
        {"name": "coder", "models": AB, "answers": True},
        {"name": "tests", "tool": True, "latency_s": 0.5, "cost": 0.1},
        {"name": "qa", "models": ["b"]},
        {"name": "lint", "tool": True, "latency_s": 0.25}]})
    invs = t.invocations()
    assert [(i.stage, i.tool_latency_s, i.tool_cost) for i in invs] == \
        [("coder", 0.0, 0.0), ("qa", 0.75, 0.1)]
    assert invs[1].models == ("b",)


@pytest.mark.parametrize("patch,needle", [
    ({"stages": []}, "workflows.math.stages: must be a non-empty array"),
    ({"stages": [{"name": "s", "models": []}]}, "workflows.math.stages[0].models"),
    ({"stages": [{"name": "s", "models": ["a", "a"], "answers": True}]}, "lists a model twice"),
    ({"stages": [{"name": "s", "models": AB}]}, "no stage has answers = true"),
    ({"stages": [{"name": "s", "models": AB, "answers": True, "latency_s": 1}]},
     "workflows.math.stages[0].latency_s: only a tool stage"),
    ({"stages": [{"name": "s", "models": AB, "answers": True, "modles": AB}]},
     "workflows.math.stages[0].modles: unknown key"),
    ({"stages": [{"name": "t", "tool": True}]}, "needs at least one LLM stage"),
    ({"stages": [{"name": "s", "models": AB}, {"name": "t", "tool": True, "answers": True}]},
     "workflows.math.stages[1].answers: a tool stage cannot give the answer"),
    ({"loop": {"from": "verifier", "to": "nope", "max_iterations": 1}},
     "workflows.math.loop.to: must name a stage"),
    ({"loop": {"from": "solver", "to": "verifier", "max_iterations": 1}},
     "workflows.math.loop.to: stage 'verifier' must come before 'solver'"),
    ({"loop": {"from": "verifier", "to": "solver", "max_iterations": -1}},
     "workflows.math.loop.max_iterations: must be an integer >= 0"),
    ({"loop": {"from": "verifier", "to": "solver", "max_iterations": 40}},
     "workflows.math.loop.max_iterations: the execution trie would have"),
    ({"extra": 1}, "workflows.math.extra: unknown key"),
])
def test_bad_templates_name_the_key(patch: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        validate_settings("vinelm", {"workflows": {"math": {**MATH, **patch}}})
    assert str(e.value).startswith("router.policies.vinelm.workflows.math")
    assert needle in str(e.value)


def test_cluster_file_reports_a_bad_template_with_file_and_key(tmp_path: Any) -> None:
    data = {"router": {"policy": "vinelm", "policies": {"vinelm": {"workflows": {
        "math": {**MATH, "stages": [{"name": "s", "models": "a", "answers": True}]}}}}},
        "engines": [{"name": "a", "model": "builtin:tiny-a"}]}
    with pytest.raises(ConfigError) as e:
        parse_cluster_config(data, "c.toml", tmp_path)
    assert e.value.key == "router.policies.vinelm.workflows.math.stages[0].models"


def test_profile_path_is_relative_to_the_cluster_file(tmp_path: Any) -> None:
    data = {"router": {"policy": "round_robin", "policies": {"vinelm": {
        "profile_path": "tries.json"}}}, "engines": [{"name": "a", "model": "builtin:tiny-a"}]}
    cfg = parse_cluster_config(data, "c.toml", tmp_path)
    assert cfg.router.policies["vinelm"]["profile_path"] == str(tmp_path / "tries.json")
