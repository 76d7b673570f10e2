"""``suites.math_template``: which GSM-symbolic template a math problem of a trace is."""

from __future__ import annotations

import reasoning_gym

from kernels_bench.lab.trace.suites import MATH_TEMPLATE_INDICES, load_problems, math_template


def test_templates_are_the_generators_own_and_problems_share_them() -> None:
    ds = reasoning_gym.create_dataset("gsm_symbolic", size=120, seed=0)
    problems = load_problems("math", 120, 0)
    got = [math_template(p.id) for p in problems]
    assert got == [f"gsm_symbolic/t{t}" for t in ds.task_indices]
    assert len(set(got)) < len(got)  # drawn with replacement: some problems share one
    # a problem's template does not depend on how many problems were drawn
    assert math_template("gsm_symbolic/0/5") == got[5]
    other = reasoning_gym.create_dataset("gsm_symbolic", size=6, seed=1).task_indices[5]
    assert math_template("gsm_symbolic/1/5") == f"gsm_symbolic/t{other}"


def test_other_ids_have_none() -> None:
    for pid in ("HumanEval/3", "gsm_symbolic/0", "gsm_symbolic/0/1/2", "gsm_symbolic/x/1",
                "gsm_symbolic/0/-1", "gsm_symbolic/0/１", "other/0/1", "",
                f"gsm_symbolic/0/{MATH_TEMPLATE_INDICES}", "gsm_symbolic/0/" + "9" * 400):
        assert math_template(pid) is None, pid
