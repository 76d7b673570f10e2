"""The agentic client: replays workflows through the router as an agent framework would.

Each workflow starts at its arrival time; each stage is sent when the previous one has
finished, with the accumulated context (``workload.context_messages``), the workflow
metadata, ``model = "auto"``, and the trace's output length of every served model in
``per_model.max_tokens`` (the router applies the one of the model it picks; with
``ignore_eos`` the engine generates exactly that many tokens). Oracle runs also send the
true remaining tokens per model in ``per_model.priority``.

Tool gaps (``--tool-gap``, ``gaps.ToolGaps``): after a non-final stage the client waits
the stage's gap before it sends the next one, and tells the router the gap in advance as
the call's ``workflow.expected_return_s`` (the engine keeps the program's KV cache about
that long). The context is the trace's messages or one growing conversation
(``workload.CONTEXTS``).

Retries: an attempt whose final answer is wrong (the trace's correctness of the model
that served its final stage; TTCA), or, with ``retry_on = "examples"``, whose final
program fails the examples its prompt states, is run again, up to ``max_attempts`` in all,
as a new program (``<job>.<attempt>``) whose calls carry ``attempt`` and, per stage, the
models already tried for that stage (``tried_models``: what the ``cascade`` policy
escalates on). Every call says whether its agent checks the answer (``checked``: it
retries, on the trace's verdict or on examples its prompt states).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from kernels_bench.lab.replay.gaps import ToolGaps
from kernels_bench.lab.replay.records import RequestRecord, WorkflowRecord
from kernels_bench.lab.replay.workload import (Job, context_messages, expected_score, outcome,
                                               per_model, remaining_tokens)
from kernels_bench.lib.priors import forced_tokens


@dataclass(frozen=True)
class ClientSettings:
    model_map: Mapping[str, str]
    """Served model -> trace model."""
    oracle: bool = False
    max_attempts: int = 1
    tool_gaps: ToolGaps = ToolGaps()
    """The gap after each non-final stage (default: none)."""
    context: str = "trace"
    """The context form of the stages (``workload.CONTEXTS``)."""
    retry_on: str = "wrong"
    """What a retry follows (``RETRY_ON``)."""


@dataclass
class CallResult:
    """What the router answered to one call."""

    model: str = ""
    engine: str = ""
    priority: int | None = None
    predicted_remaining_tokens: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    first_token_s: float | None = None
    end_s: float = 0.0
    queue_s: float | None = None
    """Engine arrival to first scheduling, where the engine reports it (the twin)."""
    error: str | None = None


Sender = Callable[[dict[str, Any]], Awaitable[CallResult]]
"""Sends one chat body and returns the result (times from the run's clock)."""


def stage_body(job: Job, attempt: int, stage: int, served: Sequence[str],
               tried: Sequence[str], s: ClientSettings) -> dict[str, Any]:
    """The chat request of ``stage`` of ``attempt`` (``served``: trace models of the
    earlier stages of this attempt; ``tried``: served models of this stage in earlier
    attempts)."""
    run = job.run
    lengths = per_model(s.model_map, forced_tokens, run, stage)
    final = stage == job.num_stages - 1
    body: dict[str, Any] = {
        "model": "auto",
        "messages": context_messages(s.context, run, stage, served),
        "max_tokens": max(lengths.values()),
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "per_model": {"max_tokens": lengths},
        "workflow": {
            "program_id": f"{job.job_id}.{attempt}",
            "workflow": run.workflow,
            "stage": run.roles[stage],
            "stage_index": stage,
            "num_stages": job.num_stages,
            "final": final,
            "attempt": attempt,
            "tried_models": list(tried),
            "checked": s.max_attempts > 1 and (s.retry_on == "wrong" or any(
                v is not None for v in job.examples.values())),
        },
    }
    if s.tool_gaps.on and not final:
        body["workflow"]["expected_return_s"] = s.tool_gaps.expected(
            job.job_id, run, attempt, stage, s.model_map)
    if s.oracle:
        body["per_model"]["priority"] = per_model(s.model_map, remaining_tokens, run, stage)
    return body


RETRY_ON = ("wrong", "examples")
"""What makes the agent try again (``--retry-on``): a wrong answer (the trace's verdict, which
no agent has: time to a correct answer), or a program that fails the examples its prompt
states (what a coding agent checks before it answers; no retry where there are none)."""


def should_retry(correct: bool, attempt: int, max_attempts: int, retry_on: str = "wrong",
                 passes_examples: bool | None = None) -> bool:
    """Another attempt follows a failed one (``retry_on``) while attempts remain."""
    failed = not correct if retry_on == "wrong" else passes_examples is False
    return failed and attempt < max_attempts


class AgenticClient:
    """Runs jobs concurrently through ``send``; ``clock`` gives seconds since run start."""

    def __init__(self, settings: ClientSettings, send: Sender,
                 clock: Callable[[], float]) -> None:
        self.settings, self.send, self.clock = settings, send, clock
        self.requests: list[RequestRecord] = []
        self.workflows: list[WorkflowRecord] = []
        self.on_outcome: Callable[[str, bool], None] | None = None
        """Told each attempt's program id and verdict when the attempt ends (an agent
        reporting its check's outcome to the router: the twin's ``online`` runs)."""

    async def run(self, jobs: Sequence[Job], progress: tqdm | None = None) -> None:
        async def one(job: Job) -> None:
            await asyncio.sleep(max(0.0, job.arrival_s - self.clock()))
            await self.workflow(job)
            if progress is not None:
                progress.update()
                progress.set_postfix(errors=sum(w.error is not None for w in self.workflows),
                                     refresh=False)

        await asyncio.gather(*(one(j) for j in jobs))

    async def workflow(self, job: Job) -> WorkflowRecord:
        """All attempts of one job (starting now, at its arrival)."""
        run = job.run
        wf = WorkflowRecord(job.job_id, run.problem_id, run.workflow, job.num_stages,
                            arrival_s=job.arrival_s, end_s=job.arrival_s)
        self.workflows.append(wf)
        tried: list[list[str]] = [[] for _ in range(job.num_stages)]
        for attempt in range(1, self.settings.max_attempts + 1):
            wf.attempts = attempt
            served: list[str] = []
            for stage in range(job.num_stages):
                rec = await self.call(job, attempt, stage, served, tried[stage])
                wf.output_tokens += rec.output_tokens
                wf.end_s = rec.end_s
                if rec.error is not None:
                    wf.error = f"stage {stage} of attempt {attempt}: {rec.error}"
                    return wf
                served.append(rec.trace_model)
                tried[stage].append(rec.model)
                if self.settings.tool_gaps.on and stage < job.num_stages - 1:
                    rec.tool_gap_s = self.settings.tool_gaps.after(
                        job.job_id, run, attempt, stage, rec.trace_model)
                    await asyncio.sleep(rec.tool_gap_s)
            wf.final_models.append(tried[-1][-1])
            wf.correct, wf.score = outcome(run, served[-1])
            if self.on_outcome is not None:
                self.on_outcome(f"{job.job_id}.{attempt}", wf.correct)
            wf.expected_score = expected_score(run, served[-1])
            if wf.correct:
                wf.ttca_s = wf.end_s - wf.arrival_s
            if not should_retry(wf.correct, attempt, self.settings.max_attempts,
                                self.settings.retry_on, job.examples.get(served[-1])):
                break
        return wf

    async def call(self, job: Job, attempt: int, stage: int, served: Sequence[str],
                   tried: Sequence[str]) -> RequestRecord:
        """Send one stage and record it."""
        body = stage_body(job, attempt, stage, served, tried, self.settings)
        send_s = self.clock()
        res = await self.send(body)
        trace_model = self.settings.model_map.get(res.model, "")
        rec = RequestRecord(
            job_id=job.job_id, program_id=body["workflow"]["program_id"], attempt=attempt,
            stage_index=stage, num_stages=job.num_stages, role=job.run.roles[stage],
            send_s=send_s, end_s=res.end_s, first_token_s=res.first_token_s,
            model=res.model, engine=res.engine, trace_model=trace_model,
            priority=res.priority, predicted_remaining_tokens=res.predicted_remaining_tokens,
            forced_tokens=body["per_model"]["max_tokens"].get(res.model, 0),
            output_tokens=res.output_tokens, prompt_tokens=res.prompt_tokens,
            trace_prompt_tokens=(job.run.models[trace_model].stages[stage].prompt_tokens
                                 if trace_model else 0),
            cached_tokens=res.cached_tokens,
            expected_return_s=body["workflow"].get("expected_return_s"), queue_s=res.queue_s,
            error=res.error)
        if rec.error is None and not trace_model:
            rec.error = f"the router chose model {res.model!r}, which the replay does not map"
        elif rec.error is None and rec.output_tokens != rec.forced_tokens:
            rec.error = (f"engine generated {rec.output_tokens} tokens, {rec.forced_tokens} "
                         "were forced (does it honour ignore_eos and max_tokens?)")
        self.requests.append(rec)
        return rec


def _header_number(value: str | None) -> float | None:
    if value is None or value == "none":
        return None
    try:
        return float(value)
    except ValueError:
        return None


def outcome_poster(http: httpx.AsyncClient, url: str,
                   pending: set[asyncio.Task[Any]]) -> Callable[[str, bool], None]:
    """What an agent does after its check (``AgenticClient.on_outcome``): ``POST url`` (the
    router's ``/v1/hetserve/outcomes``) with the attempt's program and verdict, sent in the
    background; ``pending`` holds the posts until the caller awaits them."""
    def report(program_id: str, correct: bool) -> None:
        task = asyncio.ensure_future(http.post(url, json={"program_id": program_id,
                                                          "passed": correct}))
        pending.add(task)
        task.add_done_callback(pending.discard)
    return report


def http_sender(http: httpx.AsyncClient, url: str, clock: Callable[[], float]) -> Sender:
    """A ``Sender`` that streams ``POST url`` (the router's chat endpoint)."""

    async def send(body: dict[str, Any]) -> CallResult:
        res = CallResult()
        try:
            async with http.stream("POST", url, json=body) as resp:
                h = resp.headers
                res.model = h.get("x-hetserve-model", "")
                res.engine = h.get("x-hetserve-engine", "")
                prio = _header_number(h.get("x-hetserve-priority"))
                res.priority = None if prio is None else int(prio)
                res.predicted_remaining_tokens = _header_number(
                    h.get("x-hetserve-predicted-remaining-tokens"))
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    res.error = f"HTTP {resp.status_code}: {detail}"
                else:
                    await _read_stream(resp, res, clock)
        except httpx.HTTPError as e:
            res.error = f"{type(e).__name__}: {e}"
        res.end_s = clock()
        return res

    return send


async def _read_stream(resp: httpx.Response, res: CallResult,
                       clock: Callable[[], float]) -> None:
    """Server-sent events: first chunk time, usage, a mid-stream error."""
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            res.error = f"stream event is not JSON: {data[:200]!r}"
            break
        if "error" in event:
            res.error = f"stream error: {json.dumps(event['error'])[:500]}"
            break
        if event.get("choices") and res.first_token_s is None:
            res.first_token_s = clock()
        usage = event.get("usage")
        if usage:
            res.output_tokens = int(usage.get("completion_tokens") or 0)
            res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            res.cached_tokens = None if cached is None else int(cached)


def run_clock() -> Callable[[], float]:
    """Seconds since now (the run's start)."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0
