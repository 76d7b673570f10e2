"""CHAMP conversion: answer grading by reference kind, and units from a real problem."""

from __future__ import annotations

import pytest

from kernels_bench.trace.champ import grade


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
    ("The count is $2^{n-1}$.", "2^(n-1)", (False, "expression")),
    ("The count is 2^(n-1).", "2^(n-1)", (True, "expression")),
])
def test_grade(summary: str, reference: str, expected: tuple[bool, str]) -> None:
    assert grade(summary, reference) == expected


def test_number_stated_by_the_problem_does_not_count() -> None:
    problem = "How many of a_1, ..., a_100 are integers?"
    assert grade("Among the 100 terms, 37 are integers.", "100", problem) == (False, "number")
    assert grade("Among the 100 terms, 37 are integers.", "37", problem) == (True, "number")
    assert grade("Among the first 100 terms, 10 are integers.", "100 (i.e., all numbers)",
                 problem) == (False, "number")
