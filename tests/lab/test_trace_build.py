"""Trace builder pieces that need no engine: resuming checks the header's settings and
adds the sources of models the header does not list yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_bench.lab.trace.build import Settings, open_trace
from kernels_bench.lab.trace.workflows import WORKFLOWS
from router.trace_format import (FORMAT, VERSION, Header, Message, Stage, TraceWriter,
                                        Unit, read_records)


def _header(max_tokens: int, problems: int = 10,
            sources: list[dict[str, str]] | None = None) -> Header:
    s = Settings("math", problems, 0, max_tokens, 8, 10.0)
    return Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS["math"],
                  settings=s.header_settings(), sources=sources or [], command="x")


def test_open_trace_creates_then_resumes_and_refuses_other_settings(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl.gz"
    assert open_trace(out, _header(512)) == set()
    assert read_records(out)[0].settings["max_tokens"] == 512
    assert open_trace(out, _header(512, problems=100)) == set()  # more problems: fine
    with pytest.raises(SystemExit, match="different settings"):
        open_trace(out, _header(256))


def test_a_new_model_is_added_to_the_header_and_units_are_kept(tmp_path: Path) -> None:
    data = {"name": "gsm", "license": "MIT"}
    m1 = {"name": "m1", "license": "Apache-2.0"}
    m2 = {"name": "m2", "license": "Apache-2.0"}
    out = tmp_path / "t.jsonl.gz"
    open_trace(out, _header(512, sources=[data, m1]))
    stage = Stage(index=0, role="solver", messages=[Message("user", "q")], prompt_tokens=3,
                  output_tokens=2, output_text="42", finish_reason="stop", latency_s=0.1)
    unit = Unit(key="p|solve|m1", problem_id="p", workflow="solve", model="m1",
                user_prompt="q", reference="42", stages=[stage], final_answer="42",
                correct=True, score=1.0, total_output_tokens=2, latency_s=0.1, detail="")
    with TraceWriter(out) as w:
        w.append(unit)
    before = out.read_bytes()
    assert open_trace(out, _header(512, sources=[data, m1])) == {"p|solve|m1"}
    assert out.read_bytes() == before  # nothing new: the file is untouched
    assert open_trace(out, _header(512, sources=[data, m2, m1])) == {"p|solve|m1"}
    header, units = read_records(out)
    assert header.sources == [data, m1, m2]
    assert header.command == "x" and units == [unit]
