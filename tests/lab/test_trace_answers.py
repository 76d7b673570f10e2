"""Final-answer extraction on real outputs of the Qwen models, and edge cases."""

from __future__ import annotations

import pytest

from kernels_bench.lab.trace.answers import (extract_code, extract_math_answer, number_value,
                                             numbers_equal)

# Real outputs: the last stage of Qwen2.5-Coder-0.5B-Instruct units of the shipped math
# trace (data/traces/math.jsonl.gz; the unit key, then the tail of its output text, and
# the reference answer in the comment). Extraction on these tails equals extraction on the
# whole outputs.
REAL = [
    # gsm_symbolic/0/8|solve (reference 15)
    ("her:**\n   - Add the number of toys the boy has to the number of toys the cousin has.\n"
     "   - This gives us \\(9 + 6 = 15\\).\n\nSo, the final answer is \\(\\boxed{15}\\).",
     "15", "boxed"),
    # gsm_symbolic/0/23|solve (reference 5: the model's 5/4 must not score as 5)
    ("total number of pieces by the number of pieces eaten in a week:\n   \\[\n   "
     "\\frac{60}{84} = \\frac{5}{4}\n   \\]\n\nTherefore, the pie will last for "
     "\\(\\boxed{\\frac{5}{4}}\\) days.", "1.25", "boxed"),
    # gsm_symbolic/0/7|plan_solve (reference 8)
    ("700 calories.\n- The remaining calories needed is 1100 calories.\n- The number of grams "
     "of breads you can eat is 60 grams.\n\nTherefore, the final answer is:\n\\[\n"
     "\\boxed{60}\n\\]", "60", "boxed"),
    # gsm_symbolic/0/0|solve (reference 28080)
    (" \\times £195/\\text{day} = £27600\n   \\]\n\n2. **Calculate the carpenter's annual "
     "earnings:**\n   - He works for 1 year.\n   - He earns £27600 per year.\n\nTherefore, "
     "the final answer is:\n\\[\nAnswer: £27600\n\\]", "27600", "answer_line"),
    # gsm_symbolic/0/27|plan_solve (reference 13; an empty "**Final Answer:**" line before)
    ("am have already walked = 30 minutes - 27 minutes = 3 minutes\n\n4. **Final Answer:**\n"
     "   - David and William have 3 minutes to get to bank without being late.\n\nTherefore, "
     "the final answer is `Answer: 3`.", "3", "answer_line"),
    # gsm_symbolic/0/18|solve (reference 33: the number after the last "=")
    ("imes 9 = 27\n   \\]\n\n3. **Final Answer:**\n   - Ben has 6 tubes of orange paint and 27 "
     "tubes of yellow paint.\n\nTherefore, the final answer is:\n\\[\nAnswer: 6 \\text{ orange "
     "paint} + 27 \\text{ yellow paint} = 33 \\text{ tubes of paint}\n\\]", "33", "answer_line"),
    # gsm_symbolic/0/15|solve (reference 219)
    ("Each flowering plant costs €3.\n   - Number of plants = 17.\n   - Total cost = 17 plants "
     "* €3/plant ≈ €51.\n\nTherefore, the final answer is: Answer: €51.", "51", "answer_line"),
    # gsm_symbolic/0/5|solve (reference 41; cut by max_tokens)
    ("5 \\)\n\n8. **Calculate the number of questions that are chemistry or literature and "
     "biology:**\n   - Chemistry questions: 20\n   - Literature and biology questions: 5\n   - "
     "Total questions that are chemistry or literature and biology: \\( 20 + 5 = 25 \\)\n\n9",
     "9", "last_number"),
    # gsm_symbolic/0/33|plan_solve_verify_solve (reference 65)
    ("I'm sorry, but I can't assist with that.", None, "none"),
    # gsm_symbolic/0/25|plan_solve_verify_solve (reference 632)
    ("I'm glad you found the solution correct. If you have any more questions or need further "
     "assistance, feel free to ask!", None, "none"),
]


@pytest.mark.parametrize("text, answer, method", REAL)
def test_extract_math_answer_on_real_outputs(text: str, answer: str | None,
                                             method: str) -> None:
    assert tuple(extract_math_answer(text)) == (answer, method)


BOXED_DOLLARS = r"So she saves \boxed{\$1,250.50} in total, not 399."
BOLD_ANSWER = "Steps...\n**Final Answer:** $93$ students will leave early.\n"
ANSWER_IS = "Adding these gives 80 + 13 = 93, so the final answer is 93."


@pytest.mark.parametrize("text, answer, method", [
    (BOXED_DOLLARS, "1250.50", "boxed"),
    (r"\boxed{\frac{1}{2}}", "0.5", "boxed"),
    (r"\boxed{\text{seventy}}", "seventy", "boxed"),
    (r"\boxed{10/0}", "10", "boxed"),
    (BOLD_ANSWER, "93", "answer_line"),
    (ANSWER_IS, "93", "answer_line"),
    ("Answer: -4.5 degrees", "-4.5", "answer_line"),
    ("Answer: 3/4 of a cup", "0.75", "answer_line"),
    ("Answer: £3/4", "0.75", "answer_line"),
    ("Answer: 10 / 4 = 2.5 hours", "2.5", "answer_line"),
    ("The total is 1,000,000 dollars", "1000000", "last_number"),
    ("", None, "none"),
])
def test_extract_math_answer_edge_cases(text: str, answer: str | None, method: str) -> None:
    assert tuple(extract_math_answer(text)) == (answer, method)


def test_numbers_equal() -> None:
    assert numbers_equal("70.0", "70") and numbers_equal("1,000", "1000")
    assert not numbers_equal("71", "70") and not numbers_equal("x", "70")


def test_number_value() -> None:
    assert number_value("1,250") == 1250.0 and number_value("-0.5") == -0.5
    assert all(number_value(x) is None for x in (None, "", "x", "inf", "nan", "1e999"))


CODER_OUTPUT = '''Here is the implementation:

```python
from typing import List

def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if abs(a - b) < threshold:
                return True
    return False
```

Example usage:
```python
print(has_close_elements([1.0, 2.0], 0.5))
```
'''


def test_extract_code_prefers_the_block_defining_the_entry_point() -> None:
    code = extract_code(CODER_OUTPUT, "has_close_elements")
    assert code is not None and code.startswith("from typing import List")
    assert "print(" not in code


def test_extract_code_fallbacks() -> None:
    assert extract_code("```\nx = 1\n```", "f") == "x = 1\n"
    assert extract_code("Sure.\ndef f(x):\n    return x\n", "f") == "def f(x):\n    return x\n"
    assert extract_code("no code here", "f") is None
    truncated = "```python\ndef f(x):\n    return x"  # hit max_tokens inside the block
    assert extract_code(truncated, "f") == "def f(x):\n    return x\n"
