"""``kernels_bench.lab.studies.program_check``: each problem's program runs in the sandbox
against the reference and against every model's final answer per workflow, on the fixture
trace (tests/replay_fixture.py: "small" right on even problems, "large" always; a wrong
final answer is "0"); and a results file of another kind is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kernels_bench.lab.studies import program_check as check
from router.trace_format import load_trace
from tests.replay_fixture import write_trace


def program(value: str) -> dict[str, str]:
    return {"output_text": f"```python\ndef solution():\n    return {value}\n```",
            "finish_reason": "stop"}


def test_programs_are_judged_against_the_reference_and_each_models_answer(
        tmp_path: Path) -> None:
    runs = load_trace(write_trace(tmp_path / "t.jsonl", problems=4)).runs
    # references 2p: p0's and p1's programs are right, p2's returns 5, p3 writes no code
    programs = {"p0": program("0"), "p1": program("1 + 1"), "p2": program("5"),
                "p3": {"output_text": "I cannot.", "finish_reason": "stop"}}
    c = check.checks(programs, runs, ["small", "large"])
    assert c["right"] == {"p0": True, "p1": True, "p2": False, "p3": False}
    for key, agree in c["agrees"].items():
        p = key.split("|")[0]
        # large answers 2p: it agrees where the program is right; small answers 2p on
        # even problems, "0" on odd ones: only p0's program returns its answer
        assert agree["large"] is c["right"][p]
        assert agree["small"] is (p == "p0")
    assert len(c["agrees"]) == len(runs)
    text = check.report({"model": "m", "problems": programs}, runs)
    assert "4 programs; right 2 (0.500)" in text
    assert "large: 8 rows; its answer agrees with the program in 4 (right 1.000)" in text


def cluster_file(folder: Path, engine: str, model: Path) -> Path:
    """A cluster file of one engine serving ``model`` (validated: the folder must exist)."""
    path = folder / "cluster.toml"
    path.write_text(f'[router]\npolicy = "round_robin"\n[[engines]]\n'
                    f'name = "{engine}"\nmodel = "{model}"\n')
    return path


def test_a_results_file_of_another_kind_is_one_line(tmp_path: Path) -> None:
    # a cluster file of its own: the engine's model folder must exist, not its weights
    (tmp_path / "weights").mkdir()
    cluster = cluster_file(tmp_path, "qwen2.5-coder-0.5b-instruct", tmp_path / "weights")
    bad = tmp_path / "bad.json"
    mine = {"model": "qwen2.5-coder-0.5b-instruct", "system": check.SYSTEM,
            "user": check.USER, "max_tokens": 512}
    for content in ("not json", "[1, 2]", json.dumps({"model": "other", "problems": {}}),
                    json.dumps({**mine, "problems": {"p0": {"output_text": 3}}})):
        bad.write_text(content)
        r = subprocess.run([sys.executable, "-m", "kernels_bench.lab.studies.program_check",
                            "--out", str(bad), "--report", "--cluster", str(cluster)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert str(bad) in r.stderr and "use another --out" in r.stderr


def test_a_model_not_on_this_machine_is_one_line(tmp_path: Path) -> None:
    cluster = cluster_file(tmp_path, "e", tmp_path / "absent")
    r = subprocess.run([sys.executable, "-m", "kernels_bench.lab.studies.program_check",
                        "--cluster", str(cluster), "--engine", "e", "--out",
                        str(tmp_path / "o.json"), "--report"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "does not exist" in r.stderr and str(tmp_path / "absent") in r.stderr
