"""How a call's program is found when its client names none the hetserve way
(``router.admission.programs``), the indexes that remember conversations and stored
responses (``router.state.conversations``), the agents' bodies in chat form
(``router.admission.agents``) and engine affinity's guardrail (``router.policies.affinity``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.admission import agents, programs
from router.admission.parse import parse_request
from router.policies.affinity import keep_home, overloaded
from router.request import RequestError, Workflow
from router.state.conversations import ConversationIndex, ResponseIndex, StoredResponse, Turn
from router.state.programs import ProgramTable
from router.state.view import EngineView
from router.types import Decision, RoutingRequest

TENANT = programs.scope(None, None)


def _chat(n: int, tag: str = "") -> list[dict[str, Any]]:
    """A conversation of ``n`` messages, as an agent grows it."""
    roles = ["system", "user", "assistant", "tool"]
    return [{"role": roles[min(i, 1) if i < 2 else 2 + i % 2], "content": f"{tag}{i}"}
            for i in range(n)]


def _digests(messages: list[dict[str, Any]], tenant: bytes = TENANT) -> tuple[bytes, ...]:
    return programs.conversation_digests(tenant, programs.conversation_items(
        "chat", {"messages": messages}))


# ------------------------------------------------------------ client conventions


@pytest.mark.parametrize("body, headers, source", [
    ({"vllm_xargs": {"agentic_context": {"program_id": "p"}}, "prompt_cache_key": "k"}, {},
     "agentic_context"),
    ({"vllm_xargs": {"agentic_context": {"session_id": "s", "agent_id": "sub"}}}, {},
     "agentic_context"),
    ({"prompt_cache_key": "k"}, {"x-session-id": "s"}, "session"),
    ({"session_id": "s", "prompt_cache_key": "k"}, {}, "session"),
    ({"vllm_xargs": {"session_id": "s"}}, {}, "session"),
    ({"prompt_cache_key": "k", "metadata": {"user_id": "u"}}, {}, "prompt_cache_key"),
    ({"metadata": {"user_id": "u"}}, {}, "metadata_user_id"),
])
def test_the_first_convention_in_order_names_the_program(body: dict[str, Any],
                                                         headers: dict[str, str],
                                                         source: str) -> None:
    found = programs.named(body, headers)
    assert found is not None and found[0] == source


def test_no_convention_and_bad_values_name_nothing() -> None:
    assert programs.named({}, {}) is None
    assert programs.named({"prompt_cache_key": 7, "metadata": "x", "session_id": "",
                           "vllm_xargs": {"agentic_context": "not an object"}},
                          {"x-session-id": "x" * 2000}) is None


def test_a_subagent_is_its_own_program() -> None:
    lead = programs.named({}, {"x-claude-code-session-id": "s"})
    sub = programs.named({}, {"x-claude-code-session-id": "s", "x-claude-code-agent-id": "a"})
    assert lead == ("session", "s") and sub == ("session", "s/a")


def test_ids_are_hashed_per_key_and_user() -> None:
    ids = {programs.program_id("session", programs.scope(key, user), "s")
           for key in (None, "k1", "k2") for user in (None, "u")}
    assert len(ids) == 6
    assert all(i.startswith("session:") and len(i) == len("session:") + 24 for i in ids)
    assert programs.program_id("session", TENANT, "s") == \
        programs.program_id("session", programs.scope(None, None), "s")


# ------------------------------------------------------------------ conversations


def _turn(program: str) -> Turn:
    return Turn(program, "tiny-a", "a-0")


def test_a_call_extending_a_conversation_joins_its_program() -> None:
    index = ConversationIndex(100, 60.0)
    first = _digests(_chat(2))
    assert index.find(first, 0.0) is None
    index.remember(first[-1], _turn("p"), 0.0)
    for turn in range(3, 10):  # each call re-sends the last and appends to it
        grown = _digests(_chat(turn))
        assert index.find(grown, 1.0) == _turn("p")
        index.remember(grown[-1], _turn("p"), 1.0)


def test_two_sessions_that_began_alike_never_merge() -> None:
    index = ConversationIndex(100, 60.0)
    start = _digests(_chat(2))
    index.remember(start[-1], _turn("a"), 0.0)
    index.remember(start[-1], _turn("b"), 0.0)  # the same first call in another session
    index.remember(start[-1], _turn("a"), 0.0)  # ambiguous stays ambiguous
    assert index.find(_digests(_chat(4)), 0.0) is None


def test_other_tenants_and_other_histories_do_not_match() -> None:
    index = ConversationIndex(100, 60.0)
    index.remember(_digests(_chat(3))[-1], _turn("p"), 0.0)
    assert index.find(_digests(_chat(5), programs.scope("other-key", None)), 0.0) is None
    assert index.find(_digests(_chat(5, tag="x")), 0.0) is None
    assert index.find(_digests(_chat(3)), 0.0) is None  # itself: no proper prefix of it


def test_the_index_is_bounded_and_forgets_idle_entries() -> None:
    index = ConversationIndex(3, 10.0)
    for i in range(5):
        index.remember(bytes([i]), _turn(f"p{i}"), float(i))
    assert len(index) == 3
    assert index.find([bytes([0]), b"x"], 5.0) is None  # least recently used: out
    assert index.find([bytes([4]), b"x"], 5.0) == _turn("p4")
    assert index.find([bytes([2]), b"x"], 12.5) is None  # idle for 10.5 s
    index.expire(100.0)
    assert len(index) == 0


def test_stored_responses_are_bounded_too() -> None:
    index = ResponseIndex(2, 10.0)
    for i in range(3):
        index.stored(f"r{i}", StoredResponse("e", "m", None, b"k"), 0.0)
    assert index.find("r0", b"k", 1.0) is None and index.find("r2", b"k", 1.0) is not None
    assert index.find("r2", b"k", 20.0) is None


def test_a_stored_response_is_its_owners_alone() -> None:
    index = ResponseIndex(2, 10.0)
    index.stored("r", StoredResponse("e", "m", None, programs.scope("key-1", None)), 0.0)
    assert index.find("r", programs.scope("key-2", None), 1.0) is None
    assert index.find("r", programs.scope("key-1", None), 1.0) is not None


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(st.lists(st.recursive(st.none() | st.text(max_size=8) | st.integers(),
                             lambda v: st.lists(v, max_size=3)
                             | st.dictionaries(st.text(max_size=4), v, max_size=3)),
                max_size=6))
def test_digests_are_total_and_prefix_stable(items: list[Any]) -> None:
    whole = programs.conversation_digests(TENANT, items)
    assert len(whole) == len(items)
    for k in range(len(items)):
        assert programs.conversation_digests(TENANT, items[:k + 1])[-1] == whole[k]


def test_the_program_table_is_bounded_by_activity() -> None:
    table = ProgramTable(60.0, max_programs=2)
    table.routed("a", "m", 0.0, "e1")
    table.routed("b", "m", 1.0, "e2")
    table.routed("a", "m", 2.0)  # a is active again, and keeps its engine
    table.routed("c", "m", 3.0, "e3")
    assert "b" not in table and table.engine("a") == "e1" and table.engine("c") == "e3"
    assert table.expire(62.5) == ["a"] and len(table) == 1


# ------------------------------------------------------------------ agents' bodies


def _parse(kind: Any, body: dict[str, Any]) -> Any:
    return parse_request(kind, json.dumps(body).encode(), {})


def test_a_responses_body_in_chat_form() -> None:
    parsed = _parse("responses", {
        "model": "m", "instructions": "be brief", "max_output_tokens": 5,
        "previous_response_id": "resp_1",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                  {"type": "web_search"}],
        "input": [{"role": "developer", "content": "rules"},
                  {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "reasoning", "summary": []},
                  {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c", "output": "42"}]})
    assert parsed.max_tokens == 5 and parsed.max_tokens_param == "max_output_tokens"
    assert parsed.previous_response_id == "resp_1"
    assert parsed.messages == [
        {"role": "system", "content": "be brief"}, {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "42"}]
    assert parsed.tools == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]


def test_a_messages_body_in_chat_form() -> None:
    parsed = _parse("messages", {
        "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "sys"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [
                    {"type": "text", "text": "one"}]}]}]})
    assert parsed.max_tokens == 9
    assert parsed.messages == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "f",
                                                          "arguments": '{"x":1}'}}]},
        {"role": "tool", "tool_call_id": "t", "content": "one"}]
    assert parsed.tools is not None and parsed.tools[0]["function"]["name"] == "f"


@pytest.mark.parametrize("kind, body, param", [
    ("responses", {"model": "m"}, "input"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0]"),
    ("responses", {"input": "x", "previous_response_id": "r" * 2000}, "previous_response_id"),
    ("responses", {"input": 7}, "input"),
    ("messages", {"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ("messages", {"max_tokens": 3, "messages": []}, "messages"),
    ("messages", {"max_tokens": 3, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ("messages", {"max_tokens": 3, "messages": [{"role": "user"}]}, "messages[0].content"),
    ("messages", {"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
     "max_tokens"),
])
def test_bad_agents_bodies_are_400s_naming_the_field(kind: Any, body: dict[str, Any],
                                                     param: str) -> None:
    with pytest.raises(RequestError) as info:
        _parse(kind, body)
    assert info.value.status == 400 and info.value.param == param


def test_anthropic_errors_have_anthropics_shape() -> None:
    error = RequestError(400, "nope", param="x")
    assert error.body("messages") == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "nope"}}
    assert error.body()["error"]["param"] == "x"


# ------------------------------------------------------------------------ affinity


def _engine(name: str, model: str, running: int) -> EngineView:
    return EngineView(name, model, f"http://{name}", True, running, 0, 0, 0, 0.0, 0.0,
                      running, 0.0, 0, 0, 0, None, None)


class _View:
    def __init__(self, home: str | None) -> None:
        self.home = home

    def program_engine(self, program_id: str | None) -> str | None:
        return self.home


@pytest.mark.parametrize("home_load, least, moved", [
    (64, 0, False),    # 64 more, but not more than 64 more: kept
    (65, 0, True),
    (100, 40, False),  # 60 more: kept
    (200, 134, False),  # 66 more, but under 1.5x
    (202, 134, True),
])
def test_the_guardrail_is_sglangs_rule(home_load: int, least: int, moved: bool) -> None:
    assert overloaded(home_load, least, 64, 1.5) is moved


def test_a_program_goes_home_unless_home_is_overloaded() -> None:
    req = RoutingRequest("r", None, workflow=Workflow(program_id="p"))
    cands = [_engine("a-0", "a", 3), _engine("a-1", "a", 0), _engine("b-0", "b", 0)]
    dec = Decision("r", "a-1", "a", "http://a-1", "chimera", program_id="p")
    kept = keep_home(req, dec, cands, _View("a-0"), 3, 1.5)  # type: ignore[arg-type]
    assert (kept.instance, kept.url, kept.info["affinity"]) == ("a-0", "http://a-0", "kept")
    cands[0] = _engine("a-0", "a", 4)
    moved = keep_home(req, dec, cands, _View("a-0"), 3, 1.5)  # type: ignore[arg-type]
    assert moved.instance == "a-1" and moved.info["affinity"] == "guardrail"
    other_model = dataclasses.replace(dec, instance="b-0", model="b")
    assert keep_home(req, other_model, cands, _View("a-0"), 3, 1.5) is other_model  # type: ignore[arg-type]
    assert keep_home(req, dec, cands, _View("gone-0"), 3, 1.5) is dec  # type: ignore[arg-type]


def _snapshot(core: Any, name: str, seq: int, running: int) -> None:
    from engine_ext.telemetry import SchedulerSnapshot, encode_snapshot
    snap = SchedulerSnapshot(engine_id=name, seq=seq, ts=float(seq), step=seq + 1,
                             batch_size=running, num_waiting=0, queued_prefill_tokens=0,
                             pending_decode_tokens=0, kv_usage=0.0, num_preemptions=0)
    core.membership.snapshots.feed([name.encode(), seq.to_bytes(8, "big"),
                                    encode_snapshot(snap)])


@pytest.mark.parametrize("policy, follows", [("random_mix", True), ("round_robin", False)])
def test_a_routing_core_keeps_programs_home_and_counts_the_guardrails_moves(
        policy: str, follows: bool) -> None:
    """A real ``RouterCore`` on three replicas of one model: a program's calls stay on its
    first engine though another is less busy (a policy that routes programs; its picker,
    least loaded, would move it) or go round (a baseline); once its engine runs far more
    requests than the others, the guardrail moves it and ``program_moves`` counts it."""
    import asyncio

    from router.dispatch.core import RouterCore
    from tests.remote_cluster import remote_cluster

    names = {f"e{i}": "m" for i in range(3)}
    table = {"random_mix": {"big_model": "m", "share": 1.0}}.get(policy, {})
    core = RouterCore(remote_cluster(policy, names, heartbeat_timeout_s=1e9,
                                     affinity_abs_threshold=4, affinity_rel_threshold=1.5,
                                     policies={policy: table} if table else {}), None)
    core.build_policy()
    for i, name in enumerate(names):
        _snapshot(core, name, 0, 1)

    async def route(k: int) -> Decision:
        dec = await core.routing.route(RoutingRequest(
            f"r{k}", "m", workflow=Workflow(program_id="p")))
        core.routing.on_complete(dec, 1, None)
        return dec

    async def run() -> tuple[list[str], Decision]:
        homes = [(await route(0)).instance]
        _snapshot(core, homes[0], 1, 4)  # busier than the others (1), within the guardrail
        homes += [(await route(k)).instance for k in range(1, 6)]
        _snapshot(core, homes[-1], 2, 12)  # its engine now runs 12, the others 1
        return homes, await route(99)

    homes, moved = asyncio.run(run())
    assert (len(set(homes)) == 1) is follows
    if follows:
        assert moved.instance != homes[0] and moved.info["affinity"] == "guardrail"
        assert core.state.stats.program_moves["guardrail"] == 1
    else:
        assert core.state.stats.program_moves["guardrail"] == 0


def test_a_programs_first_call_takes_no_entry_until_a_second_joins_it() -> None:
    """A ``new`` program's first call leaves the program table empty (one-call programs
    cost no entry); the call that joins it (``ClusterState.join``, as admission does for
    a conversation found) enters it on the first call's model and engine, and goes back
    to that engine though another is less busy."""
    import asyncio

    from router.dispatch.core import RouterCore
    from tests.remote_cluster import remote_cluster

    names = {f"e{i}": "m" for i in range(3)}
    core = RouterCore(remote_cluster("random_mix", names, heartbeat_timeout_s=1e9,
                                     policies={"random_mix": {"big_model": "m",
                                                              "share": 1.0}}), None)
    core.build_policy()
    for name in names:
        _snapshot(core, name, 0, 1)

    async def route(k: int, source: str) -> Decision:
        dec = await core.routing.route(RoutingRequest(
            f"r{k}", "m", workflow=Workflow(program_id="new:r0"), program_source=source))
        core.routing.on_complete(dec, 1, None)
        return dec

    first = asyncio.run(route(0, "new"))
    assert len(core.state.programs) == 0
    _snapshot(core, first.instance, 1, 3)  # its engine is now the busiest
    core.state.join(Turn("new:r0", first.model, first.instance), 0.0)
    core.state.join(Turn("new:r0", first.model, "e-elsewhere"), 0.0)  # in the table: kept
    second = asyncio.run(route(1, "conversation"))
    assert second.instance == first.instance and len(core.state.programs) == 1
    assert core.state.programs.engine("new:r0") == first.instance
