"""Request objectives in the workflow metadata: accepted forms and 400 errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.admission.parse import parse_request
from router.request import RequestError, Workflow
from router.vinelm.objective import Objective

MESSAGES = [{"role": "user", "content": "hi"}]


def parse(objective: Any = None, headers: dict[str, str] | None = None) -> Workflow:
    body: dict[str, Any] = {"messages": MESSAGES}
    if objective is not None:
        body["workflow"] = {"workflow": "math", "objective": objective}
    return parse_request("chat", json.dumps(body).encode(), headers or {}).workflow


def test_objectives_in_the_body_and_in_a_header() -> None:
    assert parse({"kind": "min_cost", "min_accuracy": 0.8}).objective == \
        Objective("min_cost", min_accuracy=0.8)
    assert parse({"kind": "max_accuracy", "max_cost": 2, "max_latency_s": 30}).objective \
        == Objective("max_accuracy", max_cost=2.0, max_latency_s=30.0)
    wf = parse(headers={"X-Hetserve-Objective": "max_accuracy, max_latency_s=12.5"})
    assert wf.objective == Objective("max_accuracy", max_latency_s=12.5)


@pytest.mark.parametrize("objective,param,needle", [
    ("fast", "workflow.objective", "must be an object"),
    ({}, "workflow.objective.kind", "must be one of min_cost, max_accuracy"),
    ({"kind": "cheapest"}, "workflow.objective.kind", "got 'cheapest'"),
    ({"kind": "min_cost"}, "workflow.objective.min_accuracy", "is required"),
    ({"kind": "min_cost", "min_accuracy": 1.5}, "workflow.objective.min_accuracy",
     "in [0, 1]"),
    ({"kind": "min_cost", "min_accuracy": "high"}, "workflow.objective.min_accuracy",
     "must be a number"),
    ({"kind": "min_cost", "min_accuracy": 0.5, "max_cost": 1},
     "workflow.objective.max_cost", "not allowed with kind min_cost"),
    ({"kind": "max_accuracy"}, "workflow.objective", "needs max_cost and/or max_latency_s"),
    ({"kind": "max_accuracy", "max_cost": -1}, "workflow.objective.max_cost", ">= 0"),
    ({"kind": "max_accuracy", "max_latency_s": 0}, "workflow.objective.max_latency_s",
     "must be > 0"),
    ({"kind": "max_accuracy", "min_accuracy": 0.5, "max_cost": 1},
     "workflow.objective.min_accuracy", "not allowed"),
    ({"kind": "max_accuracy", "max_cost": 1, "budget": 2}, "workflow.objective.budget",
     "unknown field"),
])
def test_bad_objectives_are_400_naming_the_field(objective: Any, param: str,
                                                 needle: str) -> None:
    with pytest.raises(RequestError) as e:
        parse(objective)
    assert e.value.status == 400 and e.value.param == param
    assert needle in e.value.message


def test_bad_header_objective_names_the_header() -> None:
    with pytest.raises(RequestError) as e:
        parse(headers={"X-Hetserve-Objective": "max_accuracy,max_cost=lots"})
    assert e.value.status == 400 and "X-Hetserve-Objective.max_cost" in e.value.message
