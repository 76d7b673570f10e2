"""Tool gaps between a program's calls (``--tool-gap``) and the chat context: seeded draws
that do not depend on call order, recorded per call, announced to the router as
``expected_return_s``, read from a trace that records them."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kernels_bench.lab.commands.replay import build_parser, replay_options
from kernels_bench.lab.replay import client as client_mod
from kernels_bench.lab.replay.client import AgenticClient, CallResult, ClientSettings
from kernels_bench.lab.replay.gaps import ToolGaps, check_trace_gaps, parse_tool_gap
from kernels_bench.lab.replay.workload import Job, chat_messages, context_messages
from router.trace_format import FORMAT, VERSION, Header, Trace, TraceWriter, Unit, load_trace
from tests.replay_fixture import MODELS, WORKFLOWS, tiny_trace, unit, write_trace

MAP = {"a": "small", "b": "large"}


@pytest.fixture
def trace(tmp_path: Path) -> Trace:
    return tiny_trace(tmp_path)


def plan_solve(trace: Trace, problem: int) -> Job:
    run = next(r for r in trace.runs
               if r.problem_id == f"p{problem}" and r.workflow == "plan_solve")
    return Job(f"w{problem}", run, 0.0)


class Router:
    """Serves every call on model ``a`` in 1 s of its clock; ``sleep`` moves the clock
    (the client's tool gaps)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.bodies: list[dict[str, Any]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def send(self, body: dict[str, Any]) -> CallResult:
        self.bodies.append(body)
        self.now += 1.0
        n = body["per_model"]["max_tokens"]["a"]
        return CallResult(model="a", engine="a-0", output_tokens=n, prompt_tokens=100,
                          cached_tokens=40, first_token_s=self.now - 0.5, end_s=self.now)


def replay(monkeypatch: pytest.MonkeyPatch, settings: ClientSettings,
           jobs: list[Job]) -> tuple[Router, AgenticClient]:
    router = Router()
    monkeypatch.setattr(client_mod.asyncio, "sleep", router.sleep)
    client = AgenticClient(settings, router.send, router.clock)

    async def go() -> None:
        for j in jobs:
            await client.workflow(j)

    asyncio.run(go())
    return router, client


@pytest.mark.parametrize("text, want", [
    ("none", ToolGaps("none", (), 3)), ("fixed:2.5", ToolGaps("fixed", (2.5,), 3)),
    ("exp:5", ToolGaps("exp", (5.0,), 3)), ("uniform:1,4", ToolGaps("uniform", (1.0, 4.0), 3)),
    ("lognormal:5,1", ToolGaps("lognormal", (5.0, 1.0), 3)), ("trace", ToolGaps("trace", (), 3)),
])
def test_settings_parse(text: str, want: ToolGaps) -> None:
    assert parse_tool_gap(text, seed=3) == want
    assert want.label() == text


@pytest.mark.parametrize("text", ["gauss:1", "exp", "exp:1,2", "fixed:-1", "uniform:5,1",
                                  "exp:x", "fixed:1e9", "trace:1"])
def test_bad_settings_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--tool-gap"):
        parse_tool_gap(text)


def test_draws_are_seeded_by_the_calls_place_not_their_order() -> None:
    gaps = parse_tool_gap("exp:5", seed=7)
    keys = [(f"w{i:04d}", 1, s) for i in range(400) for s in range(3)]
    forward = [gaps.draw(*k) for k in keys]
    backward = [gaps.draw(*k) for k in reversed(keys)][::-1]
    assert forward == backward and len(set(forward)) == len(forward)
    assert forward != [parse_tool_gap("exp:5", seed=8).draw(*k) for k in keys]
    assert statistics.mean(forward) == pytest.approx(5.0, rel=0.1)
    assert all(1 <= parse_tool_gap("uniform:1,4").draw(*k) <= 4 for k in keys)
    assert statistics.median(parse_tool_gap("lognormal:5,1").draw(*k)
                             for k in keys) == pytest.approx(5.0, rel=0.15)
    assert parse_tool_gap("fixed:2").draw("w0", 1, 0) == 2.0
    assert parse_tool_gap("none").draw("w0", 1, 0) == 0.0


def test_the_client_waits_records_and_announces_each_gap(
        trace: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    gaps = parse_tool_gap("exp:3", seed=1)
    jobs = [plan_solve(trace, p) for p in range(3)]
    router, client = replay(monkeypatch, ClientSettings(MAP, tool_gaps=gaps), jobs)
    for j in jobs:
        first, second = [r for r in client.requests if r.job_id == j.job_id]
        want = gaps.draw(j.job_id, 1, 0)
        assert first.tool_gap_s == first.expected_return_s == want > 0
        assert second.send_s - first.end_s == pytest.approx(want)  # waited exactly that
        assert second.tool_gap_s is None and second.expected_return_s is None  # final
        assert first.cached_tokens == 40
    bodies = {(b["workflow"]["program_id"], b["workflow"]["stage_index"]): b["workflow"]
              for b in router.bodies}
    assert bodies["w0.1", 0]["expected_return_s"] == gaps.draw("w0", 1, 0)
    assert "expected_return_s" not in bodies["w0.1", 1] and bodies["w0.1", 1]["final"]
    w = client.workflows[0]
    assert w.end_s - w.arrival_s == pytest.approx(2.0 + gaps.draw("w0", 1, 0))


def test_without_gaps_the_client_is_as_before(trace: Trace,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    router, client = replay(monkeypatch, ClientSettings(MAP), [plan_solve(trace, 0)])
    first, second = client.requests
    assert second.send_s == first.end_s and first.tool_gap_s is None
    assert all("expected_return_s" not in b["workflow"] for b in router.bodies)


def test_the_replay_command_seeds_the_gaps_with_its_seed(tmp_path: Path) -> None:
    a = build_parser(live=False).parse_args([
        "--cluster", "c.toml", "--trace", "t", "--tool-gap", "uniform:1,3", "--seed", "4",
        "--context", "chat"])
    opts = replay_options(a, tmp_path)
    assert opts.tool_gaps == ToolGaps("uniform", (1.0, 3.0), 4) and opts.context == "chat"


def with_gaps(u: Unit, gap: float) -> Unit:
    stages = [msgspec.structs.replace(s, tool_gap_s=gap + s.index) for s in u.stages]
    return msgspec.structs.replace(u, stages=stages)


def test_a_trace_records_gaps_and_the_replay_reads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = write_trace(tmp_path / "plain.jsonl")
    assert b"tool_gap_s" not in plain.read_bytes()  # traces without gaps are unchanged
    header = Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS,
                    settings={}, sources=[])
    with TraceWriter(tmp_path / "gaps.jsonl") as w:
        w.append(header)
        for m in MODELS:
            w.append(with_gaps(unit(m, 0, "plan_solve"), {"small": 2.0, "large": 4.0}[m]))
    runs = load_trace(tmp_path / "gaps.jsonl").runs
    assert [s.tool_gap_s for s in runs[0].models["large"].stages] == [4.0, 5.0]
    gaps = parse_tool_gap("trace")
    check_trace_gaps(gaps, runs, MAP)
    _, client = replay(monkeypatch, ClientSettings(MAP, tool_gaps=gaps),
                       [Job("w0", runs[0], 0.0)])
    first = client.requests[0]  # served by a (small): small's gap; announced: the mean
    assert first.tool_gap_s == 2.0 and first.expected_return_s == 3.0
    with pytest.raises(ValueError, match="records no tool_gap_s"):
        check_trace_gaps(gaps, tiny_trace(tmp_path).runs, MAP)


def test_a_chat_context_extends_the_previous_prompt_and_output(trace: Trace) -> None:
    run = plan_solve(trace, 1).run
    zero, one = chat_messages(run, 0, []), chat_messages(run, 1, ["large"])
    assert zero == context_messages("trace", run, 0, [])  # stage 0: the trace's own
    assert one[:len(zero)] == zero
    assert one[len(zero)] == {"role": "assistant",
                              "content": run.models["large"].stages[0].output_text}
    system = next(m for m in run.models["small"].stages[1].messages if m.role == "system")
    assert one[-1] == {"role": "user", "content": system.content}
