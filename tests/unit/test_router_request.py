"""Request parsing and validation of the router front (no engine, no tokenizer)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.admission.parse import context_error, parse_request
from router.admission.workflow import WORKFLOW_FIELDS, header_name, parse_workflow
from router.proxy import upstream_body
from router.request import ParsedRequest, RequestError, Workflow
from router.upstream import StreamResult, completion_tokens, relay_events

CHAT = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}


def chat(body: dict[str, Any], headers: dict[str, str] | None = None,
         **kw: Any) -> ParsedRequest:
    return parse_request("chat", json.dumps(body).encode(), headers or {}, **kw)


def rejected(kind: str, raw: bytes, headers: dict[str, str] | None = None,
             **kw: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(kind, raw, headers or {}, **kw)  # type: ignore[arg-type]
    return info.value


# ---------------------------------------------------------------- accepted bodies


def test_chat_minimal() -> None:
    p = chat(CHAT)
    assert (p.kind, p.model, p.stream, p.max_tokens, p.workflow) == ("chat", "tiny-a", False,
                                                                     None, Workflow())
    assert p.messages == CHAT["messages"] and p.body == CHAT


@pytest.mark.parametrize("model", [None, "auto"])
def test_auto_model(model: str | None) -> None:
    body = {"messages": CHAT["messages"]} | ({"model": model} if model else {})
    assert chat(body).model is None


def test_max_completion_tokens_wins_in_chat() -> None:
    p = chat({**CHAT, "max_tokens": 5, "max_completion_tokens": 7})
    assert (p.max_tokens, p.max_tokens_param) == (7, "max_completion_tokens")


def test_text_parts_joined_like_vllm() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    p = chat({"messages": [{"role": "user", "content": content}]})
    assert p.messages == [{"role": "user", "content": "a\nb"}]
    assert p.body["messages"][0]["content"] == content


def test_assistant_without_content() -> None:
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": []}]
    assert chat({"messages": msgs}).messages == msgs


@pytest.mark.parametrize("prompt, expected", [
    ("def f():", "def f():"), ([1, 2, 3], [1, 2, 3]), (["hello"], "hello"), ([[4, 5]], [4, 5]),
])
def test_completion_prompts(prompt: Any, expected: Any) -> None:
    p = parse_request("completion", json.dumps({"prompt": prompt, "max_tokens": 3}).encode(), {})
    assert (p.kind, p.prompt, p.max_tokens, p.messages) == ("completion", expected, 3, None)


def test_stream_options() -> None:
    p = chat({**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert p.stream and p.include_usage


# ---------------------------------------------------------------- rejected bodies

BAD = [
    # (kind, raw body, status, code, param, words in the message)
    ("chat", b"{", 400, "invalid_json", None, "not valid JSON"),
    ("chat", b"", 400, "invalid_json", None, "not valid JSON"),
    ("chat", b"\xff\xfe{", 400, "invalid_json", None, "not valid JSON"),
    ("chat", b"[1]", 400, "invalid_json", None, "must be a JSON object, got array"),
    ("chat", b'{"messages": NaN}', 400, "invalid_json", None, "NaN"),
    ("chat", b"[" * 100_000, 400, "invalid_json", None, "nesting too deep"),
    ("chat", b"{}", 400, "missing_field", "messages", "'messages' is required"),
    ("chat", b'{"messages": []}', 400, "invalid_value", "messages", "non-empty"),
    ("chat", b'{"messages": "hi"}', 400, "invalid_type", "messages", "got string"),
    ("chat", b'{"messages": [1]}', 400, "invalid_type", "messages[0]", "must be an object"),
    ("chat", b'{"messages": [{"content": "x"}]}', 400, "missing_field", "messages[0].role",
     "required"),
    ("chat", b'{"messages": [{"role": 3, "content": "x"}]}', 400, "invalid_type",
     "messages[0].role", "must be a string"),
    ("chat", b'{"messages": [{"role": "user"}]}', 400, "missing_field", "messages[0].content",
     "required for role 'user'"),
    ("chat", b'{"messages": [{"role": "user", "content": 5}]}', 400, "invalid_type",
     "messages[0].content", "string or an array"),
    ("chat", b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400,
     "invalid_value", "messages[0].content[0]", "'image_url' parts are not supported"),
    ("chat", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}',
     400, "invalid_type", "messages[0].content[0].text", "must be a string"),
    ("chat", b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_type", "model", "'model' must be a string"),
    ("chat", b'{"model": "", "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_value", "model", "must not be empty"),
    ("chat", b'{"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_value", "max_tokens", ">= 1"),
    ("chat", b'{"max_tokens": "9", "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_type", "max_tokens", "must be an integer"),
    ("chat", b'{"max_tokens": true, "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_type", "max_tokens", "got boolean"),
    ("chat", b'{"max_completion_tokens": -1, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_value", "max_completion_tokens", ">= 1"),
    ("chat", b'{"stream": "yes", "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_type", "stream", "must be a boolean"),
    ("chat", b'{"stream_options": 1, "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_type", "stream_options", "must be an object"),
    ("chat", b'{"n": 0, "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_value", "n", ">= 1"),
    ("chat", b'{"workflow": 1, "messages": [{"role": "user", "content": "x"}]}', 400,
     "invalid_type", "workflow", "'workflow' must be an object"),
    ("chat", b'{"workflow": {"stage_index": "1"}, "messages": [{"role": "user", '
     b'"content": "x"}]}', 400, "invalid_type", "workflow.stage_index", "must be an integer"),
    ("chat", b'{"workflow": {"program": "p"}, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_value", "workflow.program", "unknown field 'workflow.program'"),
    ("chat", b'{"workflow": {"budget": -1}, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_value", "workflow.budget", ">= 0.0"),
    ("chat", b'{"workflow": {"final": "yes"}, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_type", "workflow.final", "must be a boolean"),
    ("chat", b'{"workflow": {"tried_models": "a"}, "messages": [{"role": "user", '
     b'"content": "x"}]}', 400, "invalid_type", "workflow.tried_models", "array of strings"),
    ("chat", b'{"workflow": {"weights": {"q": "x"}}, "messages": [{"role": "user", '
     b'"content": "x"}]}', 400, "invalid_type", "workflow.weights.q", "must be a number"),
    ("chat", b'{"workflow": {"attempt": 0}, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_value", "workflow.attempt", ">= 1"),
    ("chat", b'{"workflow": {"stage_index": 3, "num_stages": 3}, "messages": [{"role": '
     b'"user", "content": "x"}]}', 400, "invalid_value", "workflow.stage_index", "must be <"),
    ("chat", b'{"workflow": {"stage": null}, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_type", "workflow.stage", "'workflow.stage' must be a string, got null"),
    ("chat", b'{"workflow": {"budget": null}, "messages": [{"role": "user", "content": "x"}]}',
     400, "invalid_type", "workflow.budget", "'workflow.budget' must be a number, got null"),
    ("chat", b'{"workflow": {"stage_index": "1", "final": null}, "messages": [{"role": '
     b'"user", "content": "x"}]}', 400, "invalid_type", "workflow.stage_index",
     "must be an integer, got string"),
    ("chat", b'{"workflow": {"final": null, "stage_index": "1"}, "messages": [{"role": '
     b'"user", "content": "x"}]}', 400, "invalid_type", "workflow.final",
     "'workflow.final' must be a boolean, got null"),
    ("completion", b"{}", 400, "missing_field", "prompt", "'prompt' is required"),
    ("completion", b'{"prompt": ""}', 400, "invalid_value", "prompt", "must not be empty"),
    ("completion", b'{"prompt": []}', 400, "invalid_value", "prompt", "must not be empty"),
    ("completion", b'{"prompt": 7}', 400, "invalid_type", "prompt", "string or an array"),
    ("completion", b'{"prompt": [1, "a"]}', 400, "invalid_type", "prompt[1]", "integer"),
    ("completion", b'{"prompt": [1, -2]}', 400, "invalid_value", "prompt[1]", ">= 0"),
    ("completion", b'{"prompt": ["a", "b"]}', 400, "invalid_value", "prompt",
     "holds 2 prompts"),
    ("completion", b'{"prompt": [["a"]]}', 400, "invalid_type", "prompt",
     "string or an array of token ids"),
]


@pytest.mark.parametrize("kind, raw, status, code, param, words", BAD,
                         ids=[f"{i}:{b[1][:40]!r}" for i, b in enumerate(BAD)])
def test_bad_bodies(kind: str, raw: bytes, status: int, code: str, param: str | None,
                    words: str) -> None:
    err = rejected(kind, raw)
    assert (err.status, err.code, err.param) == (status, code, param), err.message
    assert words in err.message
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error"


# ---------------------------------------------------------------- workflow metadata


def test_workflow_from_body() -> None:
    wf = {"program_id": "p1", "workflow": "swe", "stage": "plan", "stage_index": 0,
          "num_stages": 3, "final": False, "budget": 2, "weights": {"quality": 0.5},
          "attempt": 2, "tried_models": ["tiny-b"], "checked": True}
    assert chat({**CHAT, "workflow": wf}).workflow == Workflow(**{
        **wf, "budget": 2.0, "tried_models": ("tiny-b",)})


def test_workflow_from_headers() -> None:
    headers = {"X-Hetserve-Program-Id": "p9", "x-hetserve-workflow": "qa",
               "X-Hetserve-Stage": "answer", "X-Hetserve-Stage-Index": "1",
               "X-Hetserve-Num-Stages": "2", "X-Hetserve-Final": "true",
               "X-Hetserve-Budget": "0.25", "X-Hetserve-Attempt": "3",
               "X-Hetserve-Tried-Models": "tiny-a, tiny-b", "X-Hetserve-Checked": "no",
               "X-Hetserve-Weights": "quality=0.6,latency=0.4"}
    assert chat(CHAT, headers).workflow == Workflow(
        program_id="p9", workflow="qa", stage="answer", stage_index=1, num_stages=2,
        final=True, budget=0.25, attempt=3, tried_models=("tiny-a", "tiny-b"), checked=False,
        weights={"quality": 0.6, "latency": 0.4})


def test_body_overrides_headers() -> None:
    wf = parse_workflow({"stage": "b"}, {"X-Hetserve-Stage": "a", "X-Hetserve-Program-Id": "p"})
    assert wf == Workflow(stage="b", program_id="p")


def test_every_field_has_a_header() -> None:
    assert header_name("program_id") == "X-Hetserve-Program-Id"
    assert len({header_name(f) for f in WORKFLOW_FIELDS}) == len(WORKFLOW_FIELDS)


@pytest.mark.parametrize("headers, param, words", [
    ({"X-Hetserve-Stage-Index": "one"}, "X-Hetserve-Stage-Index", "must be an integer"),
    ({"X-Hetserve-Final": "maybe"}, "X-Hetserve-Final", "must be a boolean"),
    ({"X-Hetserve-Checked": "2"}, "X-Hetserve-Checked", "must be a boolean"),
    ({"X-Hetserve-Budget": "lots"}, "X-Hetserve-Budget", "must be a number"),
    ({"X-Hetserve-Budget": "inf"}, "X-Hetserve-Budget", "finite"),
    ({"X-Hetserve-Weights": "quality=high"}, "X-Hetserve-Weights.quality", "number"),
    ({"X-Hetserve-Program-Id": ""}, "X-Hetserve-Program-Id", "must not be empty"),
    ({"X-Hetserve-Programid": "p"}, "x-hetserve-programid", "unknown header"),
])
def test_bad_headers(headers: dict[str, str], param: str, words: str) -> None:
    err = rejected("chat", json.dumps(CHAT).encode(), headers)
    assert (err.status, err.param) == (400, param) and words in err.message


# ---------------------------------------------------------------- priority and the upstream body


def test_client_priority_ignored_unless_allowed() -> None:
    p = chat({**CHAT, "priority": 5})
    assert p.client_priority is None
    assert json.loads(upstream_body(p, "tiny-a", None, None)).get("priority") is None
    assert chat({**CHAT, "priority": 5}, allow_client_priority=True).client_priority == 5


@pytest.mark.parametrize("priority", [-1, 2**31, "1", 1.5])
def test_client_priority_validated_when_allowed(priority: Any) -> None:
    err = rejected("chat", json.dumps({**CHAT, "priority": priority}).encode(),
                   allow_client_priority=True)
    assert err.param == "priority"


def test_upstream_body() -> None:
    p = chat({**CHAT, "model": "auto", "workflow": {"program_id": "p"}, "priority": 1,
              "max_completion_tokens": 50, "temperature": 0, "stream": True})
    out = json.loads(upstream_body(p, "tiny-b", 1234, 20))
    assert out == {"model": "tiny-b", "messages": CHAT["messages"], "priority": 1234,
                   "max_completion_tokens": 20, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}}


def test_upstream_body_keeps_client_values_without_overrides() -> None:
    p = parse_request("completion", b'{"prompt": "x", "max_tokens": 4}', {})
    assert json.loads(upstream_body(p, "tiny-a", None, None)) == {
        "prompt": "x", "max_tokens": 4, "model": "tiny-a"}


# ---------------------------------------------------------------- context length


@pytest.mark.parametrize("prompt_tokens, max_tokens, param, words", [
    (1024, None, "messages", "prompt alone is 1024 tokens"),
    (1000, 25, "max_tokens", "lower max_tokens to at most 24"),
])
def test_context_exceeded(prompt_tokens: int, max_tokens: int | None, param: str,
                          words: str) -> None:
    p = chat({**CHAT, "max_tokens": max_tokens})
    err = context_error(p, "tiny-a", 1024, prompt_tokens)
    assert err is not None and (err.status, err.code, err.param) == (
        400, "context_length_exceeded", param)
    assert words in err.message and "1024" in err.message


@pytest.mark.parametrize("prompt_tokens, max_tokens", [(1023, None), (1000, 24), (1, 1023)])
def test_context_fits(prompt_tokens: int, max_tokens: int | None) -> None:
    assert context_error(chat({**CHAT, "max_tokens": max_tokens}), "m", 1024,
                         prompt_tokens) is None


# ---------------------------------------------------------------- never crashes

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)
KEYS = st.sampled_from(["model", "messages", "prompt", "max_tokens", "max_completion_tokens",
                        "stream", "stream_options", "n", "priority", "workflow"])
FIELD_NAMES = st.sampled_from(sorted(WORKFLOW_FIELDS))
BODIES = st.dictionaries(KEYS, JSON, max_size=6) | st.fixed_dictionaries(
    {"messages": st.lists(st.dictionaries(st.sampled_from(["role", "content"]), JSON),
                          max_size=3),
     "workflow": st.dictionaries(FIELD_NAMES, JSON, max_size=4)})
HEADERS = st.dictionaries(FIELD_NAMES.map(header_name) | st.text(max_size=10),
                          st.text(max_size=20), max_size=4)


def _parses_or_rejects(kind: str, raw: bytes, headers: dict[str, str], allow: bool) -> None:
    try:
        parse_request(kind, raw, headers, allow_client_priority=allow)  # type: ignore[arg-type]
    except RequestError as err:
        assert 400 <= err.status < 500 and err.message


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["chat", "completion"]), BODIES, HEADERS, st.booleans())
def test_any_json_parses_or_rejects(kind: str, body: dict[str, Any], headers: dict[str, str],
                                    allow: bool) -> None:
    _parses_or_rejects(kind, json.dumps(body).encode(), headers, allow)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["chat", "completion"]), st.binary(max_size=200))
def test_any_bytes_parse_or_reject(kind: str, raw: bytes) -> None:
    _parses_or_rejects(kind, raw, {}, False)


# ---------------------------------------------------------------- SSE relay


async def _relay(chunks: list[bytes], keep_usage: bool) -> tuple[list[bytes], StreamResult]:
    async def body() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    result = StreamResult()
    events = [e async for e in relay_events("e", body(), result, keep_usage)]
    return events, result


DELTA = b'data: {"choices": [{"delta": {"content": "x"}}], "usage": null}\n\n'
USAGE = b'data: {"choices": [], "usage": {"completion_tokens": 7}}\n\n'


@pytest.mark.parametrize("keep_usage", [True, False])
def test_relay_strips_usage_chunk_unless_asked(keep_usage: bool) -> None:
    chunks = [DELTA[:10], DELTA[10:] + DELTA, USAGE + b"data: [DONE]\n\n"]
    events, result = asyncio.run(_relay(chunks, keep_usage))
    expected = [DELTA + DELTA, (USAGE if keep_usage else b"") + b"data: [DONE]\n\n"]
    assert events == expected  # a write per read, of the events it completed
    assert (result.output_tokens, result.usage_seen) == (7, True)


def test_relay_counts_events_without_usage() -> None:
    events, result = asyncio.run(_relay([DELTA * 3], False))
    assert events == [DELTA * 3] and (result.output_tokens, result.usage_seen) == (3, False)


def test_relay_reads_the_agents_apis_events() -> None:
    """A Responses stream: the response id from ``response.created``, the output tokens
    from ``response.completed``; a Messages stream: from ``message_delta``. Every event
    passes through."""
    created = (b'event: response.created\ndata: {"type": "response.created", "response": '
               b'{"id": "resp_1", "usage": null}}\n\n')
    delta = b'event: response.output_text.delta\ndata: {"delta": "x"}\n\n'
    done = (b'event: response.completed\ndata: {"type": "response.completed", "response": '
            b'{"id": "resp_1", "usage": {"input_tokens": 3, "output_tokens": 5}}}\n\n')
    events, result = asyncio.run(_relay([created + delta, delta + done], True))
    assert b"".join(events) == created + delta + delta + done
    assert (result.response_id, result.output_tokens, result.usage_seen) == ("resp_1", 5, True)
    start = (b'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
             b'{"input_tokens": 3, "output_tokens": 0}}}\n\n')
    end = (b'event: message_delta\ndata: {"type": "message_delta", "usage": '
           b'{"output_tokens": 4}}\n\n')
    events, result = asyncio.run(_relay([start + delta + end], True))
    assert (result.response_id, result.output_tokens) == (None, 4)


def test_completion_tokens() -> None:
    assert completion_tokens(b'{"usage": {"completion_tokens": 4}}') == 4
    assert completion_tokens(b"not json") == 0 and completion_tokens(b"[]") == 0


# ---------------------------------------------------------------- hostile input

HUGE = 10**400


def _body(**extra: Any) -> bytes:
    return json.dumps({**CHAT, **extra}).encode()


@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": HUGE}, "max_tokens"),
    ({"max_tokens": 2**21}, "max_tokens"),
    ({"n": 1000}, "n"),
    ({"workflow": {"budget": HUGE}}, "workflow.budget"),
    ({"workflow": {"budget": 1e300}}, "workflow.budget"),
    ({"workflow": {"weights": {"quality": HUGE}}}, "workflow.weights.quality"),
    ({"workflow": {"num_stages": HUGE}}, "workflow.num_stages"),
    ({"workflow": {"stage_index": HUGE}}, "workflow.stage_index"),
    ({"workflow": {"attempt": HUGE}}, "workflow.attempt"),
    ({"workflow": {"objective": {"kind": "min_cost", "min_accuracy": HUGE}}},
     "workflow.objective.min_accuracy"),
    ({"workflow": {"objective": {"kind": "max_accuracy", "max_cost": -HUGE}}},
     "workflow.objective.max_cost"),
    ({"per_model": {"max_tokens": {"tiny-a": HUGE}}}, "per_model.max_tokens.tiny-a"),
])
def test_huge_numbers_are_a_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    err = rejected("chat", _body(**extra))
    assert (err.status, err.param) == (400, param), err.message
    assert len(err.message) < 200


@pytest.mark.parametrize("header, value", [
    ("X-Hetserve-Budget", "1e400"), ("X-Hetserve-Num-Stages", "9" * 5000),
    ("X-Hetserve-Weights", "quality=1e999"),
    ("X-Hetserve-Objective", "min_cost,min_accuracy=1e400"),
])
def test_huge_numbers_in_headers_are_a_400(header: str, value: str) -> None:
    assert rejected("chat", _body(), {header: value}).status == 400


def test_a_prompt_token_id_beyond_any_vocabulary_is_a_400() -> None:
    assert rejected("completion", b'{"prompt": [1, 4294967296]}').param == "prompt[1]"


@pytest.mark.parametrize("raw", [
    b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}',
])
def test_lone_surrogates_are_a_400(raw: bytes) -> None:
    err = rejected("chat", raw)
    assert err.code == "invalid_json"
    json.dumps(err.body(), ensure_ascii=False).encode("utf-8")  # the answer itself encodes


def test_surrogate_pairs_are_text() -> None:
    raw = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert parse_request("chat", raw, {}).messages == [{"role": "user", "content": "\U0001f600"}]


@pytest.mark.parametrize("extra, param", [
    ({"chat_template": "{{ 'x' * 10**9 }}"}, "chat_template"),
    ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
     "chat_template_kwargs.chat_template"),
    ({"chat_template_kwargs": {"tools_blob": "x"}}, "chat_template_kwargs.tools_blob"),
    ({"chat_template_kwargs": {"enable_thinking": {"a": 1}}},
     "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"reasoning_effort": "x" * 1000}},
     "chat_template_kwargs.reasoning_effort"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
])
def test_no_client_template(extra: dict[str, Any], param: str) -> None:
    err = rejected("chat", _body(**extra))
    assert (err.status, err.param) == (400, param), err.message


def test_allowed_template_switches_pass() -> None:
    kwargs = {"enable_thinking": False, "reasoning_effort": "low"}
    assert chat({**CHAT, "chat_template_kwargs": kwargs}).body["chat_template_kwargs"] == kwargs


def test_bytes_that_are_not_utf8_fail_alone() -> None:
    # msgspec raises UnicodeDecodeError (not one of its own errors) on such a string
    err = rejected("chat", b'{"model": "a\x80", "messages": []}')
    assert err.status == 400 and "not UTF-8" in err.body()["error"]["message"]
    assert completion_tokens(b'{"usage": {"completion_tokens": "\xff"}}') == 0
    result = StreamResult()

    async def events() -> AsyncIterator[bytes]:
        yield b'data: {"usage": "\xc3", "choices": []}\n\n'

    assert asyncio.run(_drain(relay_events("e", events(), result, keep_usage=False)))
    assert not result.usage_seen  # relayed as it came, no usage read from it


async def _drain(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [c async for c in chunks]
