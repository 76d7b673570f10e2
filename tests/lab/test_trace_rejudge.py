"""Rejudging a trace from its recorded outputs with the current extraction and scorer."""

from __future__ import annotations

from pathlib import Path

from kernels_bench.lab.commands.trace import rejudge as main
from kernels_bench.lab.trace.suites import load_problems
from kernels_bench.lab.trace.workflows import WORKFLOWS
from router.trace_format import (
    FORMAT,
    VERSION,
    Header,
    Message,
    Stage,
    TraceWriter,
    Unit,
    read_records,
    unit_key,
)


def _unit(pid: str, reference: str, output: str, answer: str, correct: bool) -> Unit:
    stage = Stage(index=0, role="solver", messages=[Message("user", "q")], prompt_tokens=5,
                  output_tokens=7, output_text=output, finish_reason="stop", latency_s=0.1)
    return Unit(key=unit_key(pid, "solve", "m"), problem_id=pid, workflow="solve", model="m",
                user_prompt="q", reference=reference, stages=[stage], final_answer=answer,
                correct=correct, score=float(correct), total_output_tokens=7, latency_s=0.1,
                detail="extracted by boxed")


def test_rejudge_updates_stale_verdicts_and_keeps_the_rest(tmp_path: Path) -> None:
    p0, p1 = load_problems("math", 2, 0)
    header = Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS["math"],
                    settings={"seed": 0}, sources=[], command="build")
    path = tmp_path / "t.jsonl.gz"
    stale = _unit(p0.id, p0.reference, r"It is \boxed{\frac{%s}{4}}." % p0.reference,
                  p0.reference, True)  # judged when fractions were cut to their numerator
    fine = _unit(p1.id, p1.reference, f"Answer: {p1.reference}", p1.reference, True)
    with TraceWriter(path) as w:
        for rec in (header, stale, fine):
            w.append(rec)
    main([str(path)])
    new_header, (a, b) = read_records(path)
    assert new_header == header
    assert (a.correct, a.score, a.detail) == (False, 0.01, "extracted by boxed")
    assert a.final_answer == str(int(p0.reference) / 4).removesuffix(".0")
    assert a.stages == stale.stages
    assert b.correct and b.final_answer == p1.reference and b.detail == "extracted by answer_line"
