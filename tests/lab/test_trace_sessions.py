"""Long agent sessions (``kernels_bench.lab.trace.sessions``): a recorded snapshot's turns,
the seeded generator's statistics, and the trace the chat context replays."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from kernels_bench.lab.replay.workload import chat_messages
from kernels_bench.lab.trace.agent import _Tokens
from kernels_bench.lab.trace.sessions import (
    MODEL,
    Session,
    SessionSettings,
    Turn,
    generate_sessions,
    recorded_sessions,
    session_of,
    write_trace,
)
from router.trace_format import Message, load_trace

CASE = {"source_session_id": "s", "source": "codex", "n_messages": 4,
        "messages": [{"role": "user", "content": "x" * 400},
                     {"role": "assistant", "content": "[Tool: a(1)] [Tool: b(2)]" + "y" * 15},
                     {"role": "user", "content": "[tool result] Wall time: 1.5 seconds\n"
                      "[tool result] Wall time: 0.25 seconds" + "z" * 23},
                     {"role": "user", "content": [{"type": "text", "text": "w"}]}],
        "reference_response": "done" * 10}


def test_a_snapshot_is_its_calls() -> None:
    """A call per assistant message and one for the reference response; added tokens are
    what precedes it since the last call (characters / 4), the tool time the sum of the
    results' wall times."""
    s = session_of(CASE)
    first_added = 100
    between = round((len(CASE["messages"][2]["content"]) + len('[{"type": "text", '
                                                               '"text": "w"}]')) / 4)
    assert s.turns == (Turn(first_added, 10, 2, 1.75), Turn(between, 10, 0, None))
    assert s.prompts() == [100, 100 + 10 + between]
    assert s.final_context == 110 + between


def sessions(seed: int, n: int = 20) -> list[Session]:
    recorded = [Session("a", "codex", (Turn(500, 20, 1, 2.0), Turn(100, 30, 1, 0.5),
                                       Turn(300, 40, 2, None))),
                Session("b", "claude-code", (Turn(800, 10, 1, None), Turn(50, 60, 3, None)))]
    return generate_sessions(SessionSettings(n, (2000, 4000), seed), recorded)


def test_generated_sessions_are_seeded_and_land_on_their_final_context() -> None:
    a, b = sessions(0), sessions(1)
    assert a == sessions(0) and a != b
    for s in a:
        assert 2000 <= s.final_context <= 4000
        assert s.turns[0].added in (500, 800) and s.turns[-1].tool_s is None
        assert all(t.tool_s in (2.0, 0.5) for t in s.turns[:-1])   # the recorded gaps
        assert all(t.output in (20, 30, 40, 10, 60) for t in s.turns)
        assert all(1 <= t.added <= 300 for t in s.turns[1:-1])      # later turns' added
    assert {s.final_context for s in a} != {a[0].final_context}      # drawn per session


def test_recorded_sessions_reach_128k() -> None:
    pytest.importorskip("lucebench")
    rec = recorded_sessions()
    assert len(rec) == 13
    assert max(s.final_context for s in rec) > 120_000
    assert sum(t.tool_s is not None for s in rec for t in s.turns) > 100


def test_the_trace_replays_as_one_growing_conversation(tmp_path: Path) -> None:
    small = [Session("a", "codex", (Turn(40, 5, 1, 2.0), Turn(20, 6, 1, 0.0), Turn(9, 4, 0, None))),
             Session("b", "codex", (Turn(30, 5, 1, 1.0), Turn(12, 3, 1, None)))]
    out = tmp_path / "s.jsonl.gz"
    write_trace(small, out, 0, {})
    trace = load_trace(out)
    assert trace.header.workflows == {"session-3": ["task", "tool", "tool"],
                                      "session-2": ["task", "tool"]}
    tokens = _Tokens("builtin:qwen2.5-7b-shape")
    for run, s in zip(trace.runs, small):
        stages = run.models[MODEL].stages
        assert [st.output_tokens for st in stages] == [t.output for t in s.turns]
        assert [st.tool_gap_s for st in stages] == [*(t.tool_s for t in s.turns[:-1]), None]
        for j, st in enumerate(stages):
            sent = chat_messages(run, j, [MODEL] * j)
            assert st.prompt_tokens == tokens.count(
                [Message(m["role"], m["content"]) for m in sent], generation=True)
        assert all(a.prompt_tokens < b.prompt_tokens for a, b in pairwise(stages))
