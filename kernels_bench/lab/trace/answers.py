"""Final-answer extraction from model outputs.

Math: the last ``\\boxed{...}``, else the last answer line (``Answer: 42``, ``**Final
Answer:** 42``, ``the final answer is 42``), else the last number in the text, else none.
A found answer is reduced to a number when it has one (``\\$1,250.`` -> ``1250``,
``\\frac{5}{4}`` -> ``1.25``, ``6 + 27 = 33`` -> ``33``).
Code: the fenced code block that defines the entry point (the last such), else the last
block, else the raw text from ``def <entry point>``.
"""

from __future__ import annotations

import math
import re
from typing import Literal, NamedTuple

Method = Literal["boxed", "answer_line", "last_number", "none"]


class Extraction(NamedTuple):
    answer: str | None
    method: Method


_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_ANSWER_LINE = re.compile(
    r"(?:^|\n)[ \t>#*_-]*(?:final\s+answer|answer)[ \t*_]*(?:is)?[ \t*_]*[:=][ \t*_]*(.+)",
    re.IGNORECASE)
_ANSWER_IS = re.compile(r"final\s+answer\s+is\s*[:=]?\s*(.+)", re.IGNORECASE)
_LATEX_NOISE = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}|\\[,!;: ]|\$")
_FRAC = re.compile(r"\\d?frac\{\s*([^{}]*?)\s*\}\{\s*([^{}]*?)\s*\}")
_FRACTION = re.compile(rf"^\s*[£€$¥]?\s*({_NUMBER.pattern})\s*/\s*({_NUMBER.pattern})")
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_math_answer(text: str) -> Extraction:
    """The final answer of a math solution and how it was found."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return Extraction(_reduce(boxed), "boxed")
    lines = _ANSWER_LINE.findall(text) or _ANSWER_IS.findall(text)
    for line in reversed(lines):
        if line.strip(" *_.$"):
            return Extraction(_reduce(line), "answer_line")
    numbers = _NUMBER.findall(text)
    if numbers:
        return Extraction(_plain(numbers[-1]), "last_number")
    return Extraction(None, "none")


def extract_code(text: str, entry_point: str) -> str | None:
    """The program a coding answer proposes for function ``entry_point`` (None: none)."""
    blocks = [body for lang, body in _FENCE.findall(text)
              if lang.lower() in ("", "python", "py", "python3")]
    defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(",
                                               b, re.MULTILINE)]
    if defining:
        return defining[-1].rstrip() + "\n"
    if blocks:
        return blocks[-1].rstrip() + "\n"
    start = re.search(rf"^(?:from|import|def\s+{re.escape(entry_point)}\b)", text, re.MULTILINE)
    return text[start.start():].rstrip() + "\n" if start else None


def number_value(answer: str | None) -> float | None:
    """The finite number an extracted answer denotes (``1,250`` -> 1250.0), else None."""
    try:
        x = float(_plain(answer or ""))
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def numbers_equal(a: str, b: str, tol: float = 1e-6) -> bool:
    """Whether two number strings denote the same value (False if either is not a number)."""
    try:
        x, y = float(_plain(a)), float(_plain(b))
    except ValueError:
        return False
    return abs(x - y) <= tol * max(1.0, abs(y))


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i: j - 1] if depth == 0 else text[i:]


def _reduce(raw: str) -> str:
    """An answer string reduced to a number: the value of a fraction (``\\frac{5}{4}``,
    ``3/4``), else the first number after the last ``=`` (``6 + 27 = 33``), else the
    first number; with no number, the string cleaned of LaTeX noise."""
    cleaned = _LATEX_NOISE.sub(lambda m: m.group(1) or "", raw).strip()
    cleaned = cleaned.replace("\\%", "%").replace("\\$", "")
    cleaned = _FRAC.sub(r"\1/\2", cleaned)
    tail = cleaned.rsplit("=", 1)[-1]
    if _NUMBER.search(tail):
        cleaned = tail
    m = _FRACTION.search(cleaned)
    if m and float(_plain(m.group(2))) != 0:
        return _decimal(float(_plain(m.group(1))) / float(_plain(m.group(2))))
    m = _NUMBER.search(cleaned)
    return _plain(m.group(0)) if m else cleaned.strip(" .*_")


def _decimal(x: float) -> str:
    """``x`` without a needless fraction part (``1.25``, ``3``)."""
    return str(int(x)) if x.is_integer() else repr(x)


def _plain(number: str) -> str:
    return number.replace(",", "")
