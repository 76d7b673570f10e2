"""``python -m kernels_bench trace champ``: champ-dataset's recorded model answers as a trace.

CHAMP (``champ-dataset``, MIT) holds 270 competition math problems with the real outputs
of four API models (GPT-3.5, GPT-4, GPT-4 Turbo, PaLM 2 Medium). Its ``0-Shot``
conversation per model is: system prompt, the problem, the model's solution, a request to
summarise the answer in one sentence, and that summary. Each becomes one unit of a
one-stage workflow ``solve`` (role ``solver``): the messages are the system prompt and
the problem, the output is the solution; token counts come from ``--tokenizer`` (the API
models' own tokenizers are not available; the default is the Qwen2.5 tokenizer the
shipped traces use). The latency is unknown (0).

Correctness compares the summary with the reference answer by the reference's kind
(recorded in each unit's ``detail``); a reference with alternatives (``C(10, 5), or
equivalently 252``) is right if any alternative matches:
- ``number`` (``252``, ``98 values``, ``3 is the only possible value``, ``The limit exists
  and is equal to 2``): the number appears in the summary (and not only because the problem
  states it), or is the summary's final answer;
- ``assignment`` (``x=2, y=1``): every ``name=value`` pair appears in the summary;
- ``negative`` (``No``, ``No integer solutions``, ``The limit does not exist``) and
  ``yes``: whether the summary contains a negation word;
- ``expression`` (``2^(n-1)``): the reference, normalised, appears in the normalised
  summary as a whole term (not inside a longer one: ``n`` is not found in ``ln(n)``, nor
  ``1/2`` in ``-1/2`` or ``1/20``). Normalised: lower case, ``\\frac{a}{b}`` as ``a/b``,
  LaTeX delimiters, ``\\left``/``\\right``, ``\\cdot``/``\\times``, ``$``, ``\\``,
  ``*``, braces and parentheses dropped, spaces ignored. An equivalent but different form
  counts as wrong, and a summary that merely mentions the reference (``whether it is
  always greater than 20``) as right.
The grading is a heuristic; the datasheet reports the units and accuracy per kind.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kernels_bench.lab.trace.answers import extract_math_answer, numbers_equal
from router.trace_format import (
    FORMAT,
    VERSION,
    Header,
    Message,
    Stage,
    TraceWriter,
    Unit,
    compact,
    unit_key,
)

MODELS = {"GPT-3.5": "gpt-3.5", "GPT-4": "gpt-4", "GPT-4 Turbo": "gpt-4-turbo",
          "PaLM 2 Medium": "palm-2-medium"}
CONVERSATION = "0-Shot"
WORKFLOWS = {"solve": ["solver"]}
SOURCE = {"name": "CHAMP (Concept and Hint-Augmented Math Problems)",
          "package": "champ-dataset==1.0.0", "license": "MIT"}

_NUM = r"-?\d+(?:\.\d+)?"
_NUMBER_FORMS = [re.compile(p, re.IGNORECASE) for p in (
    rf"({_NUM})(?: [a-z -]+)?",
    rf"({_NUM}) is the only possible value",
    rf"(?:the limit exists and is equal to|the only possible value for the limit is) ({_NUM})",
)]
_ALTERNATIVES = re.compile(r", or (?:equivalently|approximately|an equivalent form such as) ")
_ASIDE = re.compile(r"\s*\((?:i\.e\.,|no |none )[^)]*\)")
_ASSIGNMENT = re.compile(r"([a-z])\s*=\s*([-+]?\d+)", re.IGNORECASE)
_NEGATIVE_REF = re.compile(r"^(no\b|there are no|at most 0|.*\b(does not|is not|not possible)\b)",
                           re.IGNORECASE)
_FRAC = re.compile(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}")
_LATEX_DROP = re.compile(r"\\[()\[\]]|\\left|\\right|\\cdot|\\times")
_NEGATION = re.compile(r"\b(no|not|cannot|can't|impossible|none|never|doesn't|isn't|aren't)\b",
                       re.IGNORECASE)


def grade(summary: str, reference: str, problem: str = "") -> tuple[bool, str]:
    """Whether ``summary`` gives ``reference``, and the kind of comparison used."""
    results = [_grade_one(summary, alt, problem)
               for alt in _ALTERNATIVES.split(reference.strip().rstrip("."))]
    return any(ok for ok, _ in results), results[0][1]


def _grade_one(summary: str, ref: str, problem: str) -> tuple[bool, str]:
    core = _ASIDE.sub("", ref).strip()
    if core.lower() == "yes":
        return not _NEGATION.search(summary), "yes"
    if _NEGATIVE_REF.match(core):
        return bool(_NEGATION.search(summary)), "negative"
    for form in _NUMBER_FORMS:
        m = form.fullmatch(core)
        if m:
            return _has_number(summary, m.group(1), problem), "number"
    pairs = _ASSIGNMENT.findall(core)
    if pairs and _ASSIGNMENT.sub("", core).strip(" ,and") == "":
        said = {(k.lower(), int(v)) for k, v in _ASSIGNMENT.findall(summary)}
        return all((k.lower(), int(v)) in said for k, v in pairs), "assignment"
    return _contains_term(_normalise(summary), _normalise(core).replace(" ", "")), "expression"


def _has_number(summary: str, ref: str, problem: str) -> bool:
    answer, _ = extract_math_answer(summary)
    if answer is not None and numbers_equal(answer, ref):
        return True
    given = {n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", problem)}
    said = [n.replace(",", "") for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", summary)]
    return any(numbers_equal(n, ref) for n in said if n.lstrip("-") not in given)


def _normalise(text: str) -> str:
    """``text`` reduced for the ``expression`` comparison (see the module docstring); runs
    of spaces become one, kept as term boundaries."""
    text = text.lower()
    while (m := _FRAC.search(text)) is not None:
        text = text[: m.start()] + f"{m.group(1)}/{m.group(2)}" + text[m.end():]
    text = _LATEX_DROP.sub("", text)
    return re.sub(r"\s+", " ", re.sub(r"[$\\*{}()]", "", text)).strip().rstrip(".")


def _contains_term(text: str, term: str) -> bool:
    """Whether ``term`` (no spaces) occurs in ``text``, spaces allowed between its
    characters, not preceded or followed by a character that would extend it."""
    if not term:
        return False
    body = r"\s*".join(map(re.escape, term))
    return re.search(rf"(?<![\w^/+\-!.]){body}(?![\w^/+\-!]|\.\d)", text) is not None


def convert(tokenizer_path: str, out: Path, command: str) -> tuple[int, int]:
    """Write the trace; return (units written, conversations skipped)."""
    import champ_dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    problems = list(champ_dataset.load("v0").problems.values())
    header = Header(format=FORMAT, version=VERSION, suite="champ", workflows=WORKFLOWS,
                    settings={"conversation": CONVERSATION, "tokenizer": Path(tokenizer_path).name,
                              "correctness": "summary vs reference answer: number, assignment, "
                                             "yes, negative or expression match (heuristic)"},
                    sources=[SOURCE] + [{"name": m, "license": "outputs recorded in CHAMP"}
                                        for m in MODELS.values()],
                    command=command)
    out.unlink(missing_ok=True)
    written = skipped = 0
    with TraceWriter(out) as w:
        w.append(header)
        for p in tqdm(problems, desc="champ", unit="problem", file=sys.stderr):
            for champ_name, model in MODELS.items():
                unit = _unit(tok, p, champ_name, model)
                if unit is None:
                    skipped += 1
                else:
                    w.append(unit)
                    written += 1
    compact(out, out)
    return written, skipped


def _unit(tok: Any, p: Any, champ_name: str, model: str) -> Unit | None:
    msgs = p.conversations[f"{champ_name}|{CONVERSATION}"].messages
    if [m.role for m in msgs][:3] != ["System", "User", f"Model.{champ_name}"]:
        return None
    system, user, solution, summary = msgs[0], msgs[1], msgs[2], msgs[-1]
    if summary.text is None:  # the API ran out of context before the summary
        return None
    messages = [Message("system", system.text), Message("user", user.text)]
    prompt_tokens = len(tok.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        add_generation_prompt=True, tokenize=True, return_dict=False))
    output_tokens = len(tok(solution.text, add_special_tokens=False)["input_ids"])
    correct, method = grade(summary.text, p.answer, p.text)
    stage = Stage(index=0, role="solver", messages=messages, prompt_tokens=prompt_tokens,
                  output_tokens=output_tokens, output_text=solution.text,
                  finish_reason="length" if solution.error == "LENGTH_CURRENT" else "stop",
                  latency_s=0.0)
    return Unit(key=unit_key(p.identifier, "solve", model), problem_id=p.identifier,
                workflow="solve", model=model, user_prompt=user.text, reference=p.answer,
                stages=[stage], final_answer=summary.text.strip(), correct=correct,
                score=float(correct), total_output_tokens=output_tokens, latency_s=0.0,
                detail=f"graded by {method}; category {p.category}")
