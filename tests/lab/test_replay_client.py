"""The agentic client with a fake router: stage order, length forcing, retries (TTCA)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

from kernels_bench.lab.replay.client import AgenticClient, CallResult, ClientSettings, should_retry
from kernels_bench.lab.replay.workload import Job
from router.trace_format import Trace
from tests.replay_fixture import tiny_trace

MAP = {"a": "small", "b": "large"}
STEP_S = 0.01
"""The fake engine takes this long per output token."""


class FakeRouter:
    """Picks a model with ``choose(body)``; generates ``per_model.max_tokens`` of it
    (or ``generate`` tokens); the clock advances with every token."""

    def __init__(self, choose: Callable[[dict[str, Any]], str], error_at: int | None = None,
                 generate: int | None = None) -> None:
        self.choose, self.error_at, self.generate = choose, error_at, generate
        self.now = 0.0
        self.bodies: list[dict[str, Any]] = []

    def clock(self) -> float:
        return self.now

    async def send(self, body: dict[str, Any]) -> CallResult:
        self.bodies.append(body)
        if self.error_at is not None and len(self.bodies) == self.error_at:
            return CallResult(error="HTTP 503: no engine", end_s=self.now)
        model = self.choose(body)
        n = self.generate or body["per_model"]["max_tokens"][model]
        first = self.now + STEP_S
        self.now += n * STEP_S
        return CallResult(model=model, engine=f"{model}-0", output_tokens=n, prompt_tokens=50,
                          first_token_s=first, end_s=self.now)


@pytest.fixture
def trace(tmp_path: Path) -> Trace:
    return tiny_trace(tmp_path)


def job(trace: Trace, problem: int, arrival: float = 0.0) -> Job:
    run = next(r for r in trace.runs
               if r.problem_id == f"p{problem}" and r.workflow == "plan_solve")
    return Job(f"w{problem}", run, arrival)


def run_one(router: FakeRouter, j: Job, attempts: int = 1) -> AgenticClient:
    client = AgenticClient(ClientSettings(MAP, max_attempts=attempts), router.send, router.clock)
    asyncio.run(client.workflow(j))
    return client


def test_should_retry() -> None:
    assert should_retry(False, 1, 3) and should_retry(False, 2, 3)
    assert not should_retry(False, 3, 3) and not should_retry(True, 1, 3)
    # on the prompt's examples: only a program known to fail them; the verdict is ignored
    assert should_retry(True, 1, 2, "examples", False)
    assert not should_retry(False, 1, 2, "examples", True)
    assert not should_retry(False, 1, 2, "examples", None)
    assert not should_retry(True, 2, 2, "examples", False)


@pytest.mark.parametrize("examples,attempts,models", [
    ({"small": False, "large": True}, 2, ["a", "b"]),  # failed the examples: escalated
    ({"small": True, "large": True}, 1, ["a"]),  # passed them (though wrong): kept
    ({"small": None, "large": None}, 1, ["a"]),  # no examples to run: kept
])
def test_retry_on_the_prompts_examples(trace: Trace, examples: dict[str, bool | None],
                                       attempts: int, models: list[str]) -> None:
    def choose(body: dict[str, Any]) -> str:  # a cascade: the next model up on a retry
        return "b" if "a" in body["workflow"]["tried_models"] else "a"

    router = FakeRouter(choose)
    client = AgenticClient(ClientSettings(MAP, max_attempts=3, retry_on="examples"),
                           router.send, router.clock)
    asyncio.run(client.workflow(dataclasses.replace(job(trace, 3), examples=examples)))
    (wf,) = client.workflows
    assert (wf.attempts, wf.final_models) == (attempts, models)
    # the agent has a check exactly where the prompt states examples
    checked = any(v is not None for v in examples.values())
    assert {b["workflow"]["checked"] for b in router.bodies} == {checked}


def test_stages_in_order_with_forced_lengths(trace: Trace) -> None:
    router = FakeRouter(lambda b: "a" if b["workflow"]["stage_index"] == 0 else "b")
    client = run_one(router, job(trace, 1))
    r0, r1 = client.requests
    assert (r0.model, r0.trace_model, r0.forced_tokens, r0.output_tokens) == ("a", "small", 12, 12)
    assert (r1.model, r1.trace_model, r1.forced_tokens) == ("b", "large", 33)
    assert r1.send_s == pytest.approx(r0.end_s)  # the next stage waits for the previous one
    assert "small says 0" in router.bodies[1]["messages"][1]["content"]  # served history
    (wf,) = client.workflows
    assert wf.correct and wf.score == 1.0 and wf.attempts == 1  # large served the end
    assert wf.output_tokens == 45 and wf.end_s == pytest.approx(45 * STEP_S)
    assert wf.ttca_s == pytest.approx(wf.end_s)


def test_retry_until_correct_carries_tried_models(trace: Trace) -> None:
    # the fake router avoids models already tried for the stage (like LAAR's penalty)
    def choose(body: dict[str, Any]) -> str:
        return "b" if "a" in body["workflow"]["tried_models"] else "a"

    router = FakeRouter(choose)
    client = run_one(router, job(trace, 1), attempts=3)
    (wf,) = client.workflows
    assert wf.attempts == 2 and wf.correct and wf.final_models == ["a", "b"]
    assert [b["workflow"]["attempt"] for b in router.bodies] == [1, 1, 2, 2]
    assert [b["workflow"]["program_id"] for b in router.bodies] == ["w1.1", "w1.1", "w1.2",
                                                                    "w1.2"]
    assert [b["workflow"]["tried_models"] for b in router.bodies] == [[], [], ["a"], ["a"]]
    assert wf.output_tokens == (12 + 13) + (32 + 33)
    assert wf.ttca_s == pytest.approx(wf.end_s - wf.arrival_s)


def test_retries_stop_at_the_limit(trace: Trace) -> None:
    client = run_one(FakeRouter(lambda b: "a"), job(trace, 3), attempts=2)
    (wf,) = client.workflows
    assert (wf.attempts, wf.correct, wf.ttca_s, wf.score) == (2, False, None, 0.0)
    assert len(client.requests) == 4


def test_no_retry_after_a_correct_answer(trace: Trace) -> None:
    client = run_one(FakeRouter(lambda b: "a"), job(trace, 2), attempts=3)
    assert client.workflows[0].attempts == 1 and client.workflows[0].correct


def test_error_ends_the_workflow(trace: Trace) -> None:
    client = run_one(FakeRouter(lambda b: "a", error_at=2), job(trace, 1), attempts=3)
    (wf,) = client.workflows
    assert wf.error is not None and "stage 1 of attempt 1: HTTP 503" in wf.error
    assert len(client.requests) == 2 and client.requests[1].error


def test_length_not_honoured_is_an_error(trace: Trace) -> None:
    client = run_one(FakeRouter(lambda b: "a", generate=7), job(trace, 1))
    assert "engine generated 7 tokens, 12 were forced" in (client.requests[0].error or "")


def test_unmapped_model_is_an_error(trace: Trace) -> None:
    client = run_one(FakeRouter(lambda b: "zz", generate=5), job(trace, 1))
    assert "does not map" in (client.requests[0].error or "")


def test_jobs_start_at_their_arrival(trace: Trace) -> None:
    t0 = asyncio.new_event_loop()
    try:
        start = t0.time()
        router = FakeRouter(lambda b: "a")
        client = AgenticClient(ClientSettings(MAP), router.send, lambda: t0.time() - start)
        t0.run_until_complete(client.run([job(trace, 0, 0.0), job(trace, 1, 0.2)]))
    finally:
        t0.close()
    sends = sorted(r.send_s for r in client.requests if r.stage_index == 0)
    assert sends[0] < 0.1 and sends[1] >= 0.2


def sse(*events: str) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


@pytest.mark.parametrize("status, content, want", [
    (200, sse('{"choices": [{"delta": {"content": "x"}}]}',
              '{"choices": [], "usage": {"completion_tokens": 7, "prompt_tokens": 40}}',
              "[DONE]"),
     {"output_tokens": 7, "prompt_tokens": 40, "error": None, "first": True}),
    (200, sse('{"choices": [{"delta": {}}]}', '{"error": {"message": "engine died"}}'),
     {"output_tokens": 0, "error": "stream error", "first": True}),
    (200, sse("{not json"), {"output_tokens": 0, "error": "not JSON", "first": False}),
    (503, b'{"error": {"message": "no engine available"}}',
     {"output_tokens": 0, "error": "HTTP 503: {\"error\"", "first": False}),
])
def test_http_sender_reads_headers_stream_and_errors(status: int, content: bytes,
                                                     want: dict[str, Any]) -> None:
    """The client's reading of the router's answer (the HTTP exchange itself is in the
    end-to-end test against a real router)."""
    import httpx

    from kernels_bench.lab.replay.client import http_sender

    headers = {"x-hetserve-model": "a", "x-hetserve-engine": "a-0",
               "x-hetserve-priority": "25", "x-hetserve-predicted-remaining-tokens": "none"}
    transport = httpx.MockTransport(lambda req: httpx.Response(status, headers=headers,
                                                               content=content))

    async def go() -> CallResult:
        async with httpx.AsyncClient(transport=transport) as http:
            return await http_sender(http, "http://router/v1/chat/completions",
                                     lambda: 1.5)({"model": "auto"})

    res = asyncio.run(go())
    assert (res.model, res.engine, res.priority) == ("a", "a-0", 25)
    assert res.predicted_remaining_tokens is None and res.end_s == 1.5
    assert res.output_tokens == want["output_tokens"]
    assert (res.first_token_s is not None) == want["first"]
    if want["error"] is None:
        assert res.error is None and res.prompt_tokens == want["prompt_tokens"]
    else:
        assert want["error"] in (res.error or "")
