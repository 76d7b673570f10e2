"""The synthetic agent trace (``kernels_bench.lab.trace.agent``): valid, seeded, and its
prompt_tokens are what the chat context sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_bench.lab.commands.trace import main
from kernels_bench.lab.replay.workload import chat_messages
from kernels_bench.lab.trace.agent import MODEL, AgentSettings, _Tokens, generate, parse_range
from router.trace_format import Message, load_trace

SMALL = AgentSettings(programs=3, stages=3, context=(60, 90), tool=(10, 30), output=(5, 12))


def test_valid_seeded_and_counted(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl.gz"
    generate(SMALL, a)
    main(["agent", "--out", str(b), "--programs", "3", "--stages", "3", "--context", "60-90",
          "--tool", "10-30", "--output", "5-12"])
    generate(AgentSettings(**{**SMALL.__dict__, "seed": 1}), c)
    trace = load_trace(a)
    assert trace.runs == load_trace(b).runs != load_trace(c).runs
    assert trace.header.workflows == {"agent": ["read", "tool", "tool"]}
    assert len(trace.runs) == 3 and trace.models == [MODEL]
    tokens = _Tokens(SMALL.model)
    for run in trace.runs:
        stages = run.models[MODEL].stages
        for j, st in enumerate(stages):
            assert 5 <= st.output_tokens <= 12
            sent = chat_messages(run, j, [MODEL] * j)
            assert st.prompt_tokens == tokens.count(
                [Message(m["role"], m["content"]) for m in sent], generation=True)
        assert 60 < stages[0].prompt_tokens < stages[1].prompt_tokens < stages[2].prompt_tokens


def test_settings_are_checked() -> None:
    assert parse_range("4000-12000") == (4000, 12000) and parse_range("7") == (7, 7)
    with pytest.raises(ValueError):
        parse_range("a-b")
    for bad in (AgentSettings(context=(10, 5)), AgentSettings(programs=10**9),
                AgentSettings(stages=0), AgentSettings(tool=(1, 10**12))):
        with pytest.raises(ValueError):
            bad.check()
    with pytest.raises(SystemExit):
        main(["agent", "--out", "x.jsonl.gz", "--tool", "9-2"])
