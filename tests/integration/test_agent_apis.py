"""The agents' APIs through the router to real engines, driven by the clients agents use:
the openai SDK (chat with tools, streamed and not; Responses with a ``previous_response_id``
chain) and the anthropic SDK (Messages, streamed and not, ``count_tokens``), tool calls
both ways in all three. No hetserve header is sent anywhere but where a test says so: the
programs are the router's own finding (``router.admission.programs``).

The engines are the session's pair (tests/tiny_pair.py: ``a-0`` serves ``tiny-a``, ``b-0``
``tiny-b`` behind an API key); a router (``python -m router``, ``random_mix``: a policy that
routes programs, so it finds them) is started in front of them for this module. The engines run vLLM's tool-call parser (``hermes``). The
tiny random models cannot write a tool call (even one asked for), so here tool calls and
their results travel from the client to the engine, in each API's own shape, as an agent's
conversation holds them. Tool calls written by a model that can (Qwen2.5-Coder-0.5B), in
all three APIs and an agent framework's loop: examples/agent_loop.py
(``make agent-example``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from tests.engine_proc import free_port, kill_group, spawn, wait_healthy
from tests.tiny_pair import ENGINE_KEY, TinyPair

pytestmark = pytest.mark.engine

ROUTER_HEALTH_TIMEOUT_S = 90.0
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}},
        "required": ["city"], "additionalProperties": False}
"""The tool's arguments: one of two short words, so a forced call always completes."""
CHAT_TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather now",
                                              "parameters": CITY}}


@dataclass
class Router:
    url: str

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0,
                                   timeout=120)


@pytest.fixture(scope="module")
def router(tiny_pair: TinyPair) -> Iterator[Router]:
    tiny_pair.revive()
    d = tiny_pair.d
    port = free_port()
    (d / "agents.toml").write_text("\n".join([
        "[router]", 'policy = "random_mix"', f"port = {port}", "",
        "[router.policies.random_mix]", 'big_model = "tiny-b"', "share = 0.5", "",
        tiny_pair.engines_toml()]))
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = spawn([sys.executable, "-m", "router", "--config", str(d / "agents.toml")],
                     d / "agents-router.log", {ENGINE_KEY[0]: ENGINE_KEY[1]})
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, d / "agents-router.log", ROUTER_HEALTH_TIMEOUT_S)
        yield Router(url)
    finally:
        if proc is not None:
            kill_group(proc)


def _program(raw: Any) -> tuple[str, str, str]:
    """(engine, program, how it was found) of a raw SDK response."""
    h = raw.headers
    return h["x-hetserve-engine"], h["x-hetserve-program"], h["x-hetserve-program-source"]


# ------------------------------------------------------------------ chat completions


TOOL_TURN = [{"role": "assistant", "content": None, "tool_calls": [{
    "id": "call-1", "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call-1", "content": "sunny, 21 C"}]
"""An agent's tool turn: the model's call (as the engine's parser returns it) and its
result."""


@pytest.mark.parametrize("model, engine", [("tiny-a", "a-0"), ("tiny-b", "b-0")])
def test_chat_tool_turn_joins_one_program(router: Router, model: str, engine: str) -> None:
    client = router.openai()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You check weather."},
                                      {"role": "user", "content": f"Weather? ({model})"}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=[CHAT_TOOL], max_tokens=4)
    first = _program(raw)
    assert first[0] == engine and first[2] == "new"
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages + TOOL_TURN, tools=[CHAT_TOOL], max_tokens=4)
    assert _program(raw) == (engine, first[1], "conversation")
    # the tool turn reached the engine's template: the prompt grew by it
    assert raw.parse().usage.prompt_tokens > 20


def test_streamed_chat_with_tools_passes_through(router: Router) -> None:
    stream = router.openai().chat.completions.create(
        model="tiny-a", tools=[CHAT_TOOL], max_tokens=4, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Weather in a city?"}, *TOOL_TURN])
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_client_session_conventions_name_the_program(router: Router) -> None:
    """``prompt_cache_key`` and a session header name the program; the same key from
    two calls gives one program, another key another."""
    client = router.openai()
    found = []
    for key in ("job-1", "job-1", "job-2"):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-a", messages=[{"role": "user", "content": f"hi {len(found)}"}],
            max_tokens=2, extra_body={"prompt_cache_key": key})
        found.append(_program(raw))
    assert [f[2] for f in found] == ["prompt_cache_key"] * 3
    assert found[0][1] == found[1][1] != found[2][1]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-a", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_headers={"X-Claude-Code-Session-Id": "s-1"})
    assert _program(raw)[2] == "session"


# ---------------------------------------------------------------------- Responses


def test_responses_chain_stays_on_the_engine_that_stored_it(router: Router) -> None:
    """A function call and its output in the input, then a chain on the stored response."""
    client = router.openai()
    tool = {"type": "function", "name": "weather", "description": "Weather now",
            "parameters": CITY}
    raw = client.responses.with_raw_response.create(
        model="tiny-b", tools=[tool], max_output_tokens=4, instructions="You check weather.",
        input=[{"role": "user", "content": "Weather in a city?"},
               {"type": "function_call", "call_id": "c1", "name": "weather",
                "arguments": '{"city": "Oslo"}'},
               {"type": "function_call_output", "call_id": "c1", "output": "sunny"}])
    engine, program, source = _program(raw)
    assert engine == "b-0" and source == "new"
    first = raw.parse()
    assert first.usage.input_tokens > 0
    raw = client.responses.with_raw_response.create(
        model="auto", previous_response_id=first.id, max_output_tokens=4, tools=[tool],
        input=[{"role": "user", "content": "And tomorrow?"}])
    assert _program(raw) == ("b-0", program, "previous_response")
    second = raw.parse()
    assert second.previous_response_id == first.id
    # the chain's input reached the engine: the second call's prompt holds the first's
    assert second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(second.id).id == second.id


def test_streamed_responses_are_stored_too(router: Router) -> None:
    client = router.openai()
    with client.responses.stream(model="tiny-a", input="Say hi",
                                 max_output_tokens=4) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    raw = client.responses.with_raw_response.create(
        model="tiny-a", input="again", previous_response_id=final.id, max_output_tokens=2)
    assert _program(raw)[::2] == ("a-0", "previous_response")


def test_an_unknown_previous_response_is_a_clear_404(router: Router) -> None:
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        router.openai().responses.create(model="tiny-a", input="x",
                                         previous_response_id="resp_nowhere")
    with pytest.raises(openai.NotFoundError):
        router.openai().responses.retrieve("resp_nowhere")


# ----------------------------------------------------------------------- Messages


def test_messages_tool_use_round_trip(router: Router) -> None:
    """A tool use and its result in the conversation; the next turn joins its program."""
    client = router.anthropic()
    tool = {"name": "weather", "description": "Weather now", "input_schema": CITY}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in a city?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather",
                                           "input": {"city": "Lima"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "sunny"}]}]
    raw = client.messages.with_raw_response.create(
        model="tiny-b", max_tokens=4, system="You check weather.", messages=messages,
        tools=[tool])
    engine, program, source = _program(raw)
    assert engine == "b-0" and source == "new"
    reply = raw.parse()
    messages += [{"role": "assistant", "content": [{"type": "text", "text": reply.content[0].text}]},
                 {"role": "user", "content": "Thanks. And tomorrow?"}]
    raw = client.messages.with_raw_response.create(
        model="tiny-b", max_tokens=4, system="You check weather.", messages=messages,
        tools=[tool])
    assert _program(raw) == ("b-0", program, "conversation")
    assert raw.parse().usage.input_tokens > reply.usage.input_tokens


def test_streamed_messages_and_count_tokens(router: Router) -> None:
    client = router.anthropic()
    messages = [{"role": "user", "content": "Say hi"}]
    with client.messages.stream(model="tiny-a", max_tokens=4, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"
    count = client.messages.count_tokens(model="tiny-a", messages=messages)
    assert count.input_tokens > 0


def test_messages_errors_come_in_anthropics_shape(router: Router) -> None:
    reply = httpx.post(router.url + "/v1/messages", timeout=30,
                       json={"model": "tiny-a", "messages": [{"role": "user", "content": "x"}]})
    assert reply.status_code == 400
    assert reply.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "'max_tokens' is required: the most tokens to generate"}}
    with pytest.raises(anthropic.NotFoundError):
        router.anthropic().messages.create(model="no-such", max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"input": "Count to a thousand", "max_output_tokens": 500}),
    ("/v1/messages", {"max_tokens": 500, "messages": [{"role": "user", "content": "Count"}]}),
])
def test_a_stream_the_client_cuts_closes_cleanly(router: Router, path: str,
                                                 body: dict[str, Any]) -> None:
    """The client leaves after the first event: the engine's request is abandoned and
    the router keeps no request open."""
    with httpx.stream("POST", router.url + path, timeout=60,
                      json={"model": "tiny-a", "stream": True, "ignore_eos": True,
                            **body}) as reply:
        assert reply.status_code == 200
        next(reply.iter_raw())

    def open_requests() -> float:
        text = httpx.get(router.url + "/metrics", timeout=10).text
        return next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("hetserve_open_requests "))

    deadline = time.monotonic() + 60
    while open_requests() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert open_requests() == 0
    assert httpx.get(router.url + "/health", timeout=10).status_code == 200
