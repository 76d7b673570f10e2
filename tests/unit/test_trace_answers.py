"""Final-answer extraction on outputs of the real Qwen models (and edge cases)."""

from __future__ import annotations

import pytest

from kernels_bench.trace.answers import extract_code, extract_math_answer, numbers_equal

# Tails of real outputs of Qwen2.5-Coder-0.5B-Instruct on GSM-symbolic problems (the
# shipped math trace); the other cases are constructed.
BOXED = r"""   - Add the number of toys the boy has to the number of toys the cousin has.
   - This gives us \(9 + 6 = 15\).

So, the final answer is \(\boxed{15}\)."""
ANSWER_IN_DISPLAY_MATH = r"""2. **Calculate the carpenter's annual earnings:**
   - He earns £27600 per year.

Therefore, the final answer is:
\[
Answer: £27600
\]"""
ANSWER_LINE = r"""   \[
   \text{Difference} = 432,000 - 410,000 = 22,000
   \]

Therefore, the total price of the apartment is $22,000 more than Ms. Johnson's budget. \
The final answer is:
Answer: 22000"""
BOXED_DOLLARS = r"So she saves \boxed{\$1,250.50} in total, not 399."
BOLD_ANSWER = "Steps...\n**Final Answer:** $93$ students will leave early.\n"
ANSWER_IS = "Adding these gives 80 + 13 = 93, so the final answer is 93."
LAST_NUMBER = "There are 12 x 2 = 24 volleyball players, and 24 + 17 + 17 = 58 in total."
NONE = "I cannot solve this problem without more information."


@pytest.mark.parametrize("text, answer, method", [
    (BOXED, "15", "boxed"),
    (ANSWER_IN_DISPLAY_MATH, "27600", "answer_line"),
    (BOXED_DOLLARS, "1250.50", "boxed"),
    (r"\boxed{\frac{1}{2}}", "1", "boxed"),
    (r"\boxed{\text{seventy}}", "seventy", "boxed"),
    (ANSWER_LINE, "22000", "answer_line"),
    (BOLD_ANSWER, "93", "answer_line"),
    (ANSWER_IS, "93", "answer_line"),
    ("Answer: -4.5 degrees", "-4.5", "answer_line"),
    (LAST_NUMBER, "58", "last_number"),
    ("The total is 1,000,000 dollars", "1000000", "last_number"),
    (NONE, None, "none"),
    ("", None, "none"),
])
def test_extract_math_answer(text: str, answer: str | None, method: str) -> None:
    assert tuple(extract_math_answer(text)) == (answer, method)


def test_numbers_equal() -> None:
    assert numbers_equal("70.0", "70") and numbers_equal("1,000", "1000")
    assert not numbers_equal("71", "70") and not numbers_equal("x", "70")


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
