"""CHAMP conversion: answer grading by reference kind, and units from a real problem."""

from __future__ import annotations

import pytest

from kernels_bench.lab.trace.champ import grade


@pytest.mark.parametrize("summary, reference, expected", [
    ("The number of involutions on the set {1, 2, 3, 4, 5, 6} is 76.", "76", (True, "number")),
    ("There are 360 involutions on {1, 2, 3, 4, 5, 6}.", "76", (False, "number")),
    ("So 6 of the values are integers.", "6", (True, "number")),
    ("All 98 values work.", "98 values", (True, "number")),
    ("The only possible value is 3.", "3 is the only possible value", (True, "number")),
    ("The limit is 2.", "The limit exists and is equal to 2", (True, "number")),
    ("There are 252 ways.", "C(10, 5), or equivalently 252", (True, "expression")),
    ("The only solution is x = 2 and y = 1.", "x=2, y=1", (True, "assignment")),
    ("The only solution is x = 2 and y = 3.", "x=2, y=1", (False, "assignment")),
    ("No, the number is not prime.", "No", (True, "negative")),
    ("There are no integer solutions.", "No integer solutions", (True, "negative")),
    ("Yes, A is greater than 1/15.", "Yes", (True, "yes")),
    ("The equation has no integer solutions.", "Yes", (False, "yes")),
    ("The count is $2^{n-1}$.", "2^(n-1)", (True, "expression")),
    ("The count is 2^(n-1).", "2^(n-1)", (True, "expression")),
    (r"The count is \( 2^{2n-1} \).", "(4^n+2^n)/2", (False, "expression")),
    (r"It is \(\frac{n(n + 1)(2n + 1)}{6}\).",
     "sum_(i=1)^n i^2, or equivalently n(n+1)(2n+1)/6", (True, "expression")),
    (r"There are \((2n)! / (2^n \cdot n!)\) ways.", "(2n)!/(2^n*n!)", (True, "expression")),
    ("The sum is approximately 2^(n-1) * ln(n).", "n", (False, "expression")),
    ("The sum is n.", "n", (True, "expression")),
    ("The value is -1/2.", "1/2", (False, "expression")),
    ("The value is 1/20.", "1/2", (False, "expression")),
    ("The smallest value is $\\frac{1}{2}$.", "1/2", (True, "expression")),
])
def test_grade(summary: str, reference: str, expected: tuple[bool, str]) -> None:
    assert grade(summary, reference) == expected


def test_number_stated_by_the_problem_does_not_count() -> None:
    problem = "How many of a_1, ..., a_100 are integers?"
    assert grade("Among the 100 terms, 37 are integers.", "100", problem) == (False, "number")
    assert grade("Among the 100 terms, 37 are integers.", "37", problem) == (True, "number")
    assert grade("Among the first 100 terms, 10 are integers.", "100 (i.e., all numbers)",
                 problem) == (False, "number")


def test_unit_from_a_real_champ_problem() -> None:
    import champ_dataset
    from transformers import AutoTokenizer

    from engine_ext.builtin_models import resolve_model
    from kernels_bench.lab.trace.champ import _unit

    tok = AutoTokenizer.from_pretrained(resolve_model("builtin:tiny-a"))
    problems = champ_dataset.load("v0").problems
    problem = problems["P_Combinatorics_4"]
    msgs = problem.conversations["GPT-4|0-Shot"].messages
    unit = _unit(tok, problem, "GPT-4", "gpt-4")
    assert unit is not None and unit.key == "P_Combinatorics_4|solve|gpt-4"
    (stage,) = unit.stages
    assert [m.role for m in stage.messages] == ["system", "user"]
    assert stage.messages[1].content == unit.user_prompt == msgs[1].text
    assert stage.output_text == msgs[2].text and stage.role == "solver"
    assert stage.output_tokens == len(tok(msgs[2].text, add_special_tokens=False)["input_ids"])
    assert unit.total_output_tokens == stage.output_tokens > 0
    assert unit.final_answer == msgs[-1].text.strip() and unit.reference == "76"
    assert unit.correct and unit.detail.startswith("graded by number")
    # a conversation the API cut before the summary is skipped
    assert _unit(tok, problems["P_Combinatorics_14"], "GPT-4", "gpt-4") is None
