"""Datasheet numbers: counts, accuracy per model and workflow, length distributions."""

from __future__ import annotations

from pathlib import Path

from kernels_bench.trace.datasheet import distribution, main, summarize
from kernels_bench.trace.format import (
    FORMAT,
    VERSION,
    Header,
    Message,
    Stage,
    TraceWriter,
    Unit,
    load_trace,
    unit_key,
)

WORKFLOWS = {"plan_solve": ["planner", "solver"], "solve": ["solver"]}
COMMAND = ("python -m kernels_bench trace build --cluster c.toml --suite math --problems 2 "
           "--out t.jsonl.gz --models small")


def _unit(pid: str, workflow: str, model: str, lengths: list[int], correct: bool) -> Unit:
    stages = [Stage(index=i, role=r, messages=[Message("user", "q")], prompt_tokens=5,
                    output_tokens=n, output_text="", finish_reason="length" if n >= 100 else "stop",
                    latency_s=0.0)
              for i, (r, n) in enumerate(zip(WORKFLOWS[workflow], lengths))]
    return Unit(key=unit_key(pid, workflow, model), problem_id=pid, workflow=workflow,
                model=model, user_prompt=pid, reference="1", stages=stages, final_answer="1",
                correct=correct, score=float(correct), total_output_tokens=sum(lengths),
                latency_s=0.0, detail="extracted by boxed")


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl.gz"
    with TraceWriter(path) as w:
        w.append(Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS,
                        settings={"seed": 0}, sources=[{"name": "x", "license": "MIT"}],
                        command=COMMAND))
        w.append(_unit("p0", "solve", "small", [10], False))
        w.append(_unit("p0", "plan_solve", "small", [20, 30], True))
        w.append(_unit("p1", "solve", "small", [40], True))
        w.append(_unit("p0", "solve", "big", [100], True))
    return path


def test_summarize(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    s = summarize(load_trace(path), path)
    assert s["problems"] == 2 and s["units_expected_per_model"] == 4
    assert s["units"] == {"big": 1, "small": 3} and s["complete_runs"] == 1
    assert s["accuracy"]["small"]["solve"] == {"n": 2, "accuracy": 0.5}
    assert s["accuracy"]["small"]["all"]["accuracy"] == 2 / 3
    assert s["stage_output_tokens"]["small"]["mean"] == 25.0
    assert s["workflow_output_tokens"]["small"]["plan_solve"]["p50"] == 50.0
    assert s["truncated_stages"] == {"big": 1, "small": 0}
    assert s["judged"]["small"] == {"boxed": 3}
    assert s["rebuild"] == ("python -m kernels_bench trace build --cluster c.toml --suite math "
                            f"--problems 2 --out {path.as_posix()}")


def test_distribution() -> None:
    d = distribution([1, 2, 3, 4])
    assert (d["n"], d["mean"], d["p50"], d["max"]) == (4, 2.5, 2.5, 4.0)
    assert distribution([]) == {"n": 0}


def test_main_writes_markdown_json_and_png(tmp_path: Path) -> None:
    out = tmp_path / "DATASHEET.md"
    main([str(_trace(tmp_path)), "--out", str(out)])
    text = out.read_text()
    assert "| small | 100.0% (1) | 50.0% (2) | 66.7% (3) |" in text
    assert out.with_suffix(".json").exists() and out.with_suffix(".png").stat().st_size > 0
