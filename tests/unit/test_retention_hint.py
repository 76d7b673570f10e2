"""The KV retention hint on the wire (no engine): the contract, the engine server's guard,
and the body the router sends (router.proxy.upstream_body)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_ext.priority_guard import body_error
from router.admission.parse import parse_request
from router.proxy import retention_for, upstream_body
from router.request import ParsedRequest, RequestError
from scheduler_patches.contract import RetentionHint, retention_hint

CHAT = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}


def chat(workflow: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
         trusted: bool = True, **fields: Any) -> ParsedRequest:
    body = {**CHAT, **fields} | ({"workflow": workflow} if workflow is not None else {})
    return parse_request("chat", json.dumps(body).encode(), headers or {}, trusted=trusted)


def sent(parsed: ParsedRequest) -> dict[str, Any]:
    return json.loads(upstream_body(parsed, "tiny-a", None, None, retention_for(parsed.workflow)))


# ---------------------------------------------------------------- the contract


@pytest.mark.parametrize("hint", [RetentionHint("p"), RetentionHint("p", True),
                                  RetentionHint("p", False, 2.5)])
def test_hint_round_trips_through_vllm_xargs(hint: RetentionHint) -> None:
    assert retention_hint(hint.xargs()) == hint
    assert retention_hint({**hint.xargs(), "other": 1}) == hint


def test_no_hint_without_its_keys() -> None:
    assert retention_hint(None) is None and retention_hint({"session_id": "s"}) is None


@pytest.mark.parametrize("xargs, key", [
    ({"hetserve_final": 0}, "hetserve_program_id"),
    ({"hetserve_program_id": ""}, "hetserve_program_id"),
    ({"hetserve_program_id": 7}, "hetserve_program_id"),
    ({"hetserve_program_id": "p" * 1025}, "hetserve_program_id"),
    ({"hetserve_program_id": "p", "hetserve_final": 2}, "hetserve_final"),
    ({"hetserve_program_id": "p", "hetserve_final": "yes"}, "hetserve_final"),
    ({"hetserve_program_id": "p", "hetserve_expected_return_s": -1}, "expected_return_s"),
    ({"hetserve_program_id": "p", "hetserve_expected_return_s": "5"}, "expected_return_s"),
    ({"hetserve_program_id": "p", "hetserve_expected_return_s": 1e9}, "expected_return_s"),
])
def test_malformed_hints_name_their_key(xargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        retention_hint(xargs)


# ---------------------------------------------------------------- the engine server's guard


def test_guard_rejects_a_malformed_hint_and_passes_a_good_one() -> None:
    bad = {"prompt": "x", "vllm_xargs": {"hetserve_final": 1}}
    message, param = body_error(json.dumps(bad).encode()) or ("", "")
    assert param == "vllm_xargs" and "hetserve_program_id" in message
    good = {"prompt": "x", "priority": 3, "vllm_xargs": RetentionHint("p", False, 1).xargs()}
    assert body_error(json.dumps(good).encode()) is None
    assert body_error(b'{"priority": -1}') == (
        "priority must be in [0, 2147483647], got -1", "priority")


# ---------------------------------------------------------------- what the router sends


def test_a_non_final_stage_carries_its_program_and_expected_return() -> None:
    p = chat({"program_id": "job-1", "stage_index": 0, "num_stages": 3,
              "expected_return_s": 4})
    assert sent(p)["vllm_xargs"] == {"hetserve_program_id": "job-1", "hetserve_final": 0,
                                     "hetserve_expected_return_s": 4.0}
    assert "workflow" not in sent(p)


@pytest.mark.parametrize("workflow", [
    {"program_id": "job-1", "stage_index": 2, "num_stages": 3},
    {"program_id": "job-1", "final": True},
])
def test_a_final_stage_says_so(workflow: dict[str, Any]) -> None:
    assert sent(chat(workflow))["vllm_xargs"] == {"hetserve_program_id": "job-1",
                                                  "hetserve_final": 1}


def test_headers_carry_the_expected_return() -> None:
    p = chat(headers={"X-Hetserve-Program-Id": "j", "X-Hetserve-Final": "false",
                      "X-Hetserve-Expected-Return-S": "1.5"})
    assert retention_hint(sent(p)["vllm_xargs"]) == RetentionHint("j", False, 1.5)
    with pytest.raises(RequestError) as info:
        chat(headers={"X-Hetserve-Expected-Return-S": "soon"})
    assert info.value.param == "X-Hetserve-Expected-Return-S"


@pytest.mark.parametrize("workflow", [
    None, {"program_id": "job-1"}, {"stage_index": 0, "num_stages": 2, "final": False},
])
def test_no_hint_without_a_program_and_its_position(workflow: dict[str, Any] | None) -> None:
    assert "vllm_xargs" not in sent(chat(workflow))


def test_an_untrusted_callers_position_and_return_are_dropped_so_no_hint() -> None:
    p = chat({"program_id": "job-1", "final": False, "expected_return_s": 4}, trusted=False)
    assert "vllm_xargs" not in sent(p)
    assert set(p.ignored) == {"final", "expected_return_s"}


def test_only_the_router_sets_the_hetserve_keys() -> None:
    forged = {"hetserve_program_id": "victim", "hetserve_final": 1, "custom": "kept"}
    assert sent(chat(None, vllm_xargs=forged))["vllm_xargs"] == {"custom": "kept"}
    p = chat({"program_id": "job-1", "final": False}, vllm_xargs=forged)
    assert sent(p)["vllm_xargs"] == {"custom": "kept", "hetserve_program_id": "job-1",
                                     "hetserve_final": 0}
    assert sent(chat(None, vllm_xargs="junk"))["vllm_xargs"] == "junk"  # the engine's 400
