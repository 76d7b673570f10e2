"""Trace format: round trip, validation errors that name the bad record, torn tails."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

from router.trace_format import (
    FORMAT,
    VERSION,
    Header,
    Message,
    Stage,
    TraceFormatError,
    TraceWriter,
    Unit,
    compact,
    load_trace,
    unit_key,
)

WORKFLOWS = {"plan_solve": ["planner", "solver"], "solve": ["solver"]}


def header() -> Header:
    return Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS,
                  settings={"seed": 0}, sources=[{"name": "test"}])


def stage(i: int, role: str, tokens: int) -> Stage:
    return Stage(index=i, role=role, messages=[Message("system", "s"), Message("user", "u")],
                 prompt_tokens=10, output_tokens=tokens, output_text="x" * tokens,
                 finish_reason="stop", latency_s=0.5)


def unit(pid: str = "p0", workflow: str = "plan_solve", model: str = "m1",
         correct: bool = True) -> Unit:
    roles = WORKFLOWS[workflow]
    stages = [stage(i, r, 5 * (i + 1)) for i, r in enumerate(roles)]
    return Unit(key=unit_key(pid, workflow, model), problem_id=pid, workflow=workflow,
                model=model, user_prompt=f"question {pid}", reference="42", stages=stages,
                final_answer="42", correct=correct, score=1.0 if correct else 0.01,
                total_output_tokens=sum(s.output_tokens for s in stages), latency_s=1.0)


def write(path: Path, records: list) -> Path:
    with TraceWriter(path) as w:
        for r in records:
            w.append(r)
    return path


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip_groups_models_per_workflow_run(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, [header(), unit(model="m1"), unit(model="m2", correct=False),
                                   unit(pid="p1", workflow="solve")])
    t = load_trace(path)
    assert t.models == ["m1", "m2"]
    assert [(r.problem_id, r.workflow) for r in t.runs] == [("p0", "plan_solve"), ("p1", "solve")]
    run = t.runs[0]
    assert run.roles == ["planner", "solver"]
    assert run.models["m2"].correct is False
    assert run.models["m1"].remaining_output_tokens(1) == 10
    assert run.models["m1"].total_output_tokens == 15
    assert [r.problem_id for r in t.complete_runs()] == ["p0"]


def _lines(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _good() -> list[dict]:
    import msgspec

    return [msgspec.to_builtins(header()), msgspec.to_builtins(unit())]


@pytest.mark.parametrize("mutate, message", [
    (lambda u: u["stages"][1].__setitem__("output_tokens", -3), "stages[1].output_tokens"),
    (lambda u: u["stages"][0].__setitem__("output_tokens", "7"), "Expected `int`, got `str`"),
    (lambda u: u.pop("correct"), "missing required field `correct`"),
    (lambda u: u.__setitem__("total_output_tokens", 99), "stages sum to 15"),
    (lambda u: u.update(workflow="nope", key="p0|nope|m1"), "not in the header's workflows"),
    (lambda u: u["stages"].pop(), "differ from workflow"),
    (lambda u: u.__setitem__("key", "other"), "is not problem_id|workflow|model"),
    (lambda u: u.__setitem__("surprise", 1), "unknown field `surprise`"),
])
def test_bad_unit_error_names_line_key_and_field(tmp_path: Path, mutate, message: str) -> None:
    head, u = _good()
    mutate(u)
    with pytest.raises(TraceFormatError) as err:
        load_trace(_lines(tmp_path, [head, u]))
    text = str(err.value)
    assert "line 2" in text and message in text
    assert f"(unit {u['key']})" in text


def test_bytes_that_are_not_utf8_are_a_format_error(tmp_path: Path) -> None:
    head, u = _good()
    path = _lines(tmp_path, [head, u])
    path.write_bytes(path.read_bytes().replace(b'"key": "', b'"key": "\xff', 1))
    with pytest.raises(TraceFormatError, match="line 2"):
        load_trace(path)


def test_header_errors(tmp_path: Path) -> None:
    head, u = _good()
    with pytest.raises(TraceFormatError, match="line 1: the first record must be the header"):
        load_trace(_lines(tmp_path, [u]))
    with pytest.raises(TraceFormatError, match="line 1: trace format version 99"):
        load_trace(_lines(tmp_path, [{**head, "version": 99}, u]))
    with pytest.raises(TraceFormatError, match="line 1: trace format version 2"):
        load_trace(_lines(tmp_path, [{**head, "version": 2, "new_field": 1}, u]))
    with pytest.raises(TraceFormatError, match="line 1: not a trace"):
        load_trace(_lines(tmp_path, [{**head, "format": "other"}, u]))
    with pytest.raises(TraceFormatError, match="line 3 .*duplicate key, first on line 2"):
        load_trace(_lines(tmp_path, [head, u, u]))
    with pytest.raises(TraceFormatError, match="empty trace"):
        load_trace(_lines(tmp_path, []))
    with pytest.raises(TraceFormatError, match="line 2.*malformed|line 2.*JSON"):
        (tmp_path / "j.jsonl").write_text(json.dumps(head) + "\n{not json}\n")
        load_trace(tmp_path / "j.jsonl")


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_torn_tail_is_ignored_and_repaired_before_append(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, [header(), unit(model="m1")])
    whole = path.read_bytes()
    more = write(tmp_path / ("more" + name), [unit(model="m2")]).read_bytes()
    path.write_bytes(whole + more[: len(more) // 2])  # a build killed mid-append
    assert load_trace(path).models == ["m1"]
    write(path, [unit(model="m3")])
    assert load_trace(path).models == ["m1", "m3"]


def test_compact_sorts_and_makes_one_member(tmp_path: Path) -> None:
    src = write(tmp_path / "a.jsonl.gz", [header(), unit(pid="p1"), unit(pid="p0")])
    dst = tmp_path / "b.jsonl.gz"
    assert compact(src, dst) == 2
    assert [r.problem_id for r in load_trace(dst).runs] == ["p0", "p1"]
    assert gzip.decompress(dst.read_bytes()).count(b"\n") == 3


def test_compact_without_keeps_only_the_problems_a_grown_file_adds(tmp_path: Path,
                                                                    capsys) -> None:
    from kernels_bench.lab.commands.trace import main

    old = write(tmp_path / "old.jsonl.gz", [header(), unit(pid="p0")])
    grown = write(tmp_path / "grown.jsonl.gz",
                  [header(), unit(pid="p2"), unit(pid="p0"), unit(pid="p1")])
    dst = tmp_path / "new.jsonl.gz"
    assert compact(grown, dst, old) == 2
    assert [r.problem_id for r in load_trace(dst).runs] == ["p1", "p2"]
    with pytest.raises(SystemExit) as code:
        main(["compact", str(grown), str(dst), "--without", str(tmp_path / "absent.jsonl.gz")])
    assert "trace compact:" in str(code.value) and "absent" in str(code.value)


def test_compact_workflows_keeps_those_and_names_only_them(tmp_path: Path) -> None:
    from kernels_bench.lab.commands.trace import main

    src = write(tmp_path / "a.jsonl.gz", [header(), unit(pid="p0", workflow="plan_solve"),
                                          unit(pid="p0", workflow="solve"),
                                          unit(pid="p1", workflow="solve")])
    dst = tmp_path / "b.jsonl.gz"
    assert compact(src, dst, workflows=["solve"]) == 2
    t = load_trace(dst)
    assert list(t.header.workflows) == ["solve"]
    assert [(r.problem_id, r.workflow) for r in t.runs] == [("p0", "solve"), ("p1", "solve")]
    with pytest.raises(SystemExit) as code:
        main(["compact", str(src), str(dst), "--workflows", "solve", "nope"])
    assert "no workflow nope" in str(code.value)
    assert load_trace(dst).header.workflows.keys() == {"solve"}


def test_compact_merges_traces_of_the_same_settings(tmp_path: Path) -> None:
    from kernels_bench.lab.commands.trace import main

    a = write(tmp_path / "a.jsonl.gz", [header(), unit(pid="p0"), unit(pid="p1")])
    b = write(tmp_path / "b.jsonl.gz", [header(), unit(pid="p1"), unit(pid="p2")])
    dst = tmp_path / "ab.jsonl.gz"
    main(["compact", str(a), str(b), str(dst)])
    assert [r.problem_id for r in load_trace(dst).runs] == ["p0", "p1", "p2"]
    other = write(tmp_path / "c.jsonl.gz", [header(), unit(pid="p1", correct=False)])
    with pytest.raises(SystemExit) as code:
        main(["compact", str(a), str(other), str(dst)])
    assert "differs from another file's" in str(code.value)
    seeded = msgspec.structs.replace(header(), settings={"seed": 1})
    d = write(tmp_path / "d.jsonl.gz", [seeded, unit(pid="p3")])
    with pytest.raises(SystemExit) as code:
        main(["compact", str(a), str(d), str(dst)])
    assert "header" in str(code.value) and "not merged" in str(code.value)
    assert [r.problem_id for r in load_trace(dst).runs] == ["p0", "p1", "p2"]


def test_validate_command_reports_each_file(tmp_path: Path, capsys) -> None:
    from kernels_bench.lab.commands.trace import main

    good = write(tmp_path / "good.jsonl.gz", [header(), unit(model="m1"), unit(model="m2")])
    head, u = _good()
    u["stages"][0]["output_tokens"] = -1
    bad = _lines(tmp_path, [head, u])
    with pytest.raises(SystemExit) as code:
        main(["validate", str(good), str(bad)])
    assert code.value.code == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"ok {good}: suite math, 1 workflow runs, 2 units, models m1, m2")
    assert out[1].startswith(f"INVALID {bad}: line 2 (unit p0|plan_solve|m1): ")
    assert "$.stages[0].output_tokens" in out[1]


def test_commands_report_bad_input_in_one_line(tmp_path: Path) -> None:
    from kernels_bench.lab.commands.trace import main

    head, u = _good()
    u["stages"][0]["output_tokens"] = -1
    bad = _lines(tmp_path, [head, u])
    for argv, message in [
        (["compact", str(tmp_path / "missing.jsonl.gz"), str(tmp_path / "x.jsonl.gz")],
         "trace compact: error: [Errno 2] No such file or directory"),
        (["datasheet", str(bad), "--out", str(tmp_path / "d.md")],
         f"trace datasheet: error: {bad}: line 2 (unit p0|plan_solve|m1): "),
        (["build", "--cluster", str(tmp_path / "none.toml"), "--suite", "math",
          "--problems", "1", "--out", str(tmp_path / "t.jsonl.gz")],
         f"trace build: error: {tmp_path / 'none.toml'}: (file): cannot read"),
    ]:
        with pytest.raises(SystemExit) as code:
            main(argv)
        assert str(code.value.code).startswith(message), code.value.code


def test_outputs_go_into_new_folders(tmp_path: Path) -> None:
    from kernels_bench.lab.commands.trace import main

    src = write(tmp_path / "a.jsonl.gz", [header(), unit()])
    main(["compact", str(src), str(tmp_path / "new" / "b.jsonl.gz")])
    main(["datasheet", str(src), "--out", str(tmp_path / "sheets" / "DATASHEET.md")])
    assert len(load_trace(tmp_path / "new" / "b.jsonl.gz").runs) == 1
    assert (tmp_path / "sheets" / "DATASHEET.png").stat().st_size > 0
