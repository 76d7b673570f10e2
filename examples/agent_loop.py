"""Agents pointed at the router unchanged: tool loops in all three APIs, no hetserve header.

Four agent sessions at once against a router in front of two replicas of a model that calls
tools (examples/agent_loop.toml). Each asks for a tool call first (``tool_choice``
``required``, Anthropic's ``any``: the 0.5B model does not write Qwen's tool-call tags
unasked), then lets the model answer (the Agents SDK resets ``tool_choice`` after a call):

- the OpenAI Agents SDK (``openai-agents``, unmodified), its chat-completions model and its
  Responses model, each running its own tool loop (the model calls ``add``, the SDK runs it
  and sends the result back, the model answers);
- the openai SDK's Responses API by hand, chained by ``previous_response_id``;
- the anthropic SDK's Messages API by hand (``tool_use``, then ``tool_result``).

Each call's engine and program come back in the router's ``x-hetserve-*`` headers (read by
an httpx hook on each client: the agents send nothing of hetserve's). The run fails unless
every session called its tool and every call of a session went to one engine under one
program.

    python -m launcher examples/agent_loop.toml          # in one terminal, or --start below
    python examples/agent_loop.py --router http://127.0.0.1:8300
    make agent-example                                    # fetch the model, start, run, stop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import anthropic
import httpx
import httpx2
import openai
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                    Runner, function_tool, set_tracing_disabled)

MODEL = "qwen2.5-coder-0.5b-instruct"
QUESTION = "Use the add tool to compute {a} + {b}, then tell me the sum."
CALLS: dict[str, list[dict[str, str]]] = defaultdict(list)
"""Session -> the router's headers of each of its calls."""
TOOL_RUNS: dict[str, int] = defaultdict(int)


def recorder(session: str) -> httpx2.AsyncClient:
    """An HTTP client (``httpx2``'s, the one the openai and anthropic SDKs take) that notes
    the router's decision headers of every answer."""
    async def note(response: Any) -> None:
        h = response.headers
        if "x-hetserve-engine" in h:
            CALLS[session].append({"path": response.request.url.path,
                                   "engine": h["x-hetserve-engine"],
                                   "program": h.get("x-hetserve-program", "none"),
                                   "source": h.get("x-hetserve-program-source", "none")})
    return httpx2.AsyncClient(timeout=600, event_hooks={"response": [note]})


def add_tool(session: str) -> Any:
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        TOOL_RUNS[session] += 1
        return a + b
    return add


async def agents_sdk(url: str, session: str, responses: bool, a: int, b: int) -> str:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused",
                                http_client=recorder(session))
    model = (OpenAIResponsesModel if responses else OpenAIChatCompletionsModel)(
        model=MODEL, openai_client=client)
    agent = Agent(name="calculator", instructions="You are a calculator. Always use tools.",
                  tools=[add_tool(session)], model=model,
                  model_settings=ModelSettings(temperature=0, max_tokens=128,
                                               tool_choice="required"))
    result = await Runner.run(agent, QUESTION.format(a=a, b=b), max_turns=4)
    return str(result.final_output)


ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}


async def responses_by_hand(url: str, session: str, a: int, b: int) -> str:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused",
                                http_client=recorder(session))
    tools: Any = [{"type": "function", "name": "add", "description": "Add two integers.",
                   "parameters": ADD}]
    reply = await client.responses.create(model=MODEL, input=QUESTION.format(a=a, b=b),
                                          tools=tools, tool_choice="required", temperature=0,
                                          max_output_tokens=128)
    for _ in range(3):
        calls = [item for item in reply.output if item.type == "function_call"]
        if not calls:
            return reply.output_text
        outputs: Any = []
        for call in calls:
            args = json.loads(call.arguments)
            TOOL_RUNS[session] += 1
            outputs.append({"type": "function_call_output", "call_id": call.call_id,
                            "output": str(args["a"] + args["b"])})
        reply = await client.responses.create(model=MODEL, previous_response_id=reply.id,
                                              input=outputs, tools=tools, temperature=0,
                                              max_output_tokens=128)
    return reply.output_text


async def messages_by_hand(url: str, session: str, a: int, b: int) -> str:
    client = anthropic.AsyncAnthropic(base_url=url, api_key="unused",
                                      http_client=recorder(session))
    tools: Any = [{"name": "add", "description": "Add two integers.", "input_schema": ADD}]
    messages: list[Any] = [{"role": "user", "content": QUESTION.format(a=a, b=b)}]
    for turn in range(3):
        reply = await client.messages.create(
            model=MODEL, max_tokens=128, tools=tools, messages=messages,
            tool_choice={"type": "any" if turn == 0 else "auto"},
            extra_body={"temperature": 0})  # vLLM's field; this SDK has none
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "assistant", "content": [block.model_dump() for block in
                                                          reply.content]})
        results = []
        for use in uses:
            TOOL_RUNS[session] += 1
            results.append({"type": "tool_result", "tool_use_id": use.id,
                            "content": str(int(use.input["a"]) + int(use.input["b"]))})
        messages.append({"role": "user", "content": results})
    return "(no answer within 3 tool turns)"


def wait_router(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the launcher exited ({proc.returncode}) before the router "
                             "was up")
        try:
            if httpx.get(url + "/health", timeout=5).json().get("engines_up") == 2:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(2)
    raise SystemExit(f"the router at {url} did not see both engines within {timeout_s:g} s")


async def run(url: str) -> bool:
    set_tracing_disabled(True)
    sessions = {"agents-sdk-chat": agents_sdk(url, "agents-sdk-chat", False, 17, 25),
                "agents-sdk-responses": agents_sdk(url, "agents-sdk-responses", True, 40, 2),
                "responses": responses_by_hand(url, "responses", 19, 23),
                "messages": messages_by_hand(url, "messages", 30, 12)}
    answers = dict(zip(sessions, await asyncio.gather(*sessions.values(),
                                                      return_exceptions=True)))
    ok = True
    print(f"{'session':22} {'calls':>5} {'tools':>5} {'engines':12} {'found by':28} answer")
    for name, answer in answers.items():
        calls = CALLS[name]
        engines = sorted({c["engine"] for c in calls})
        programs = {c["program"] for c in calls}
        sources = ",".join(dict.fromkeys(c["source"] for c in calls))
        good = (not isinstance(answer, BaseException) and TOOL_RUNS[name] > 0
                and len(engines) == 1 and len(programs) == 1)
        ok &= good
        shown = repr(answer)[:60] if isinstance(answer, BaseException) else \
            str(answer).replace("\n", " ")[:60]
        print(f"{name:22} {len(calls):5} {TOOL_RUNS[name]:5} {','.join(engines):12} "
              f"{sources:28} {shown}{'' if good else '   <- FAILED'}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--router", default="http://127.0.0.1:8300", help="default %(default)s")
    p.add_argument("--start", metavar="CLUSTER_TOML",
                   help="start this cluster with the launcher first, stop it after")
    a = p.parse_args()
    proc = None
    if a.start:
        proc = subprocess.Popen([sys.executable, "-m", "launcher", a.start],
                                start_new_session=True)
        print(f"starting {a.start} (the two engines take a minute or two) ...", flush=True)
    try:
        if proc is not None:
            wait_router(a.router, proc, 600)
        ok = asyncio.run(run(a.router))
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
