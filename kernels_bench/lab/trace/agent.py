"""Synthetic long-context agent programs as a trace (``python -m kernels_bench trace
agent``), to measure KV retention where prefill is dear (docs/research/retention.md,
"Long-context agents").

One problem per program, workflow ``agent``: stage 0 reads a context (a repository or a
document, ``context`` tokens) and answers; each of the ``stages - 1`` later stages appends a
tool's output (``tool`` tokens) and answers again; every answer is ``output`` tokens. Each
length is drawn uniformly from its range, seeded by (seed, program), so a file is the same
on every machine. The texts are random words of Python's keywords and builtins, cut to
length with the tokenizer of ``model`` (every ``builtin:*`` model shares one).

The stages are written for ``--context chat`` (``replay.workload.chat_messages``): stage 0
holds the system prompt and the context; stage j > 0 holds only what the agent appends, the
tool output as its one user turn, which the chat context adds after stage j-1's answer.
``prompt_tokens`` is the whole conversation's, as the engine computes it with that context.
(``--context trace`` would send each tool output alone.)

Made up, not measured: every text, length and outcome. Every run is "correct" with score 1,
so quality, accuracy and cost-per-correct are meaningless here; only latency and KV
measures mean anything.
"""

from __future__ import annotations

import builtins
import keyword
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from router.trace_format import FORMAT, VERSION, Header, Message, Stage, Unit, unit_key, \
    write_records

SUITE = "agent"
WORKFLOW = "agent"
MODEL = "synthetic-agent"
"""The trace's one model: map the served model to it (``--model-map agent=synthetic-agent``)."""
SYSTEM = ("You are a coding agent. Read the repository below, then call tools and answer "
          "after each tool result.")
WORDS = tuple(sorted({*keyword.kwlist, *(n for n in dir(builtins) if not n.startswith("_"))}))
"""The vocabulary of the random texts."""
MAX_PROGRAMS, MAX_STAGES, MAX_TOKENS = 100_000, 1_000, 1_000_000
"""Bounds of the settings (a file of that size is hours of tokenizing already)."""


@dataclass(frozen=True)
class AgentSettings:
    """The generator's settings; token ranges are inclusive (lo, hi)."""

    programs: int = 200
    stages: int = 6
    context: tuple[int, int] = (4000, 12000)
    tool: tuple[int, int] = (200, 2000)
    output: tuple[int, int] = (20, 200)
    seed: int = 0
    model: str = "builtin:qwen2.5-7b-shape"
    """Whose tokenizer counts the tokens."""

    def check(self) -> None:
        """ValueError on a setting the generator cannot honour."""
        if not (1 <= self.programs <= MAX_PROGRAMS and 1 <= self.stages <= MAX_STAGES):
            raise ValueError(f"programs must be 1-{MAX_PROGRAMS} and stages 1-{MAX_STAGES}")
        for name in ("context", "tool", "output"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi <= MAX_TOKENS:
                raise ValueError(f"{name} range {lo}-{hi}: need 1 <= lo <= hi <= {MAX_TOKENS}")


class _Tokens:
    """Counts and cuts text with the chat template and tokenizer of a model."""

    def __init__(self, model: str) -> None:
        from transformers import AutoTokenizer

        from engine_ext.builtin_models import resolve_model

        self.tok = AutoTokenizer.from_pretrained(resolve_model(model), local_files_only=True)
        probe = [Message("user", "probe")]
        self.generation = self.count(probe, True) - self.count(probe)
        """Tokens of the generation prompt (the assistant turn's opening)."""

    def count(self, messages: Sequence[Message], generation: bool = False) -> int:
        """Prompt tokens of ``messages`` as the router computes them (the chat template
        rendered, then encoded: ``router.tokenize``)."""
        text = self.tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], tokenize=False,
            add_generation_prompt=generation)
        return len(self.tok.encode(text, add_special_tokens=False))

    def text(self, rng: random.Random, n: int) -> str:
        """Random words cut to ``n`` tokens (about: decoding and encoding again may merge a
        few)."""
        words: list[str] = []
        ids: list[int] = []
        while len(ids) < n:
            words += [rng.choice(WORDS) + ("\n" if rng.random() < 0.1 else " ")
                      for _ in range(n)]
            ids = self.tok.encode("".join(words), add_special_tokens=False)
        return self.tok.decode(ids[:n])


def program(tokens: _Tokens, s: AgentSettings, index: int) -> Unit:
    """Program ``index`` of the file of ``s``."""
    rng = random.Random(f"{s.seed}|{index}")
    problem = f"{SUITE}/{s.seed}/{index}"
    task = f"Task {index}: find and fix the failing test.\n"
    first = [Message("system", SYSTEM),
             Message("user", task + tokens.text(rng, rng.randint(*s.context)))]
    conversation = tokens.count(first)
    # Counted turn by turn: the template's special tokens separate turns, so a
    # conversation's tokens are the sum of its turns' (tests/lab/test_trace_agent.py).
    stages = []
    for j, role in enumerate(roles(s.stages)):
        new = first if j == 0 else [Message("user", "Tool result:\n"
                                            + tokens.text(rng, rng.randint(*s.tool)))]
        if j:
            conversation += tokens.count(new)
        out = rng.randint(*s.output)
        answer = tokens.text(rng, out)
        stages.append(Stage(index=j, role=role, messages=new,
                            prompt_tokens=conversation + tokens.generation,
                            output_tokens=out, output_text=answer, finish_reason="length",
                            latency_s=0.0))
        conversation += tokens.count([Message("assistant", answer)])
    return Unit(key=unit_key(problem, WORKFLOW, MODEL), problem_id=problem, workflow=WORKFLOW,
                model=MODEL, user_prompt=task, reference="", stages=stages, final_answer=None,
                correct=True, score=1.0, total_output_tokens=sum(st.output_tokens
                                                                 for st in stages),
                latency_s=0.0, detail="synthetic: no outcome")


def roles(stages: int) -> list[str]:
    """The ``agent`` workflow's roles: one ``read`` stage, then ``tool`` stages."""
    return ["read"] + ["tool"] * (stages - 1)


def generate(s: AgentSettings, out: Path, command: str = "") -> list[Unit]:
    """Write the trace of ``s`` to ``out``; its units."""
    s.check()
    tokens = _Tokens(s.model)
    units = [program(tokens, s, i) for i in range(s.programs)]
    settings: dict[str, Any] = {**asdict(s), "context_form": "chat"}
    header = Header(format=FORMAT, version=VERSION, suite=SUITE,
                    workflows={WORKFLOW: roles(s.stages)}, settings=settings,
                    sources=[{"name": "synthetic", "generator": "kernels_bench.lab.trace.agent",
                              "license": "none (generated)"}], command=command)
    write_records(out, header, units)
    return units


def parse_range(text: str) -> tuple[int, int]:
    """``"4000-12000"`` -> ``(4000, 12000)``; ``"100"`` -> ``(100, 100)``."""
    lo, _, hi = text.partition("-")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"{text!r}: expected LO-HI or N (tokens)") from None


def summary(units: Sequence[Unit]) -> str:
    """One line: programs, mean context, mean final prompt, mean output per stage."""
    n = len(units)
    first = sum(u.stages[0].prompt_tokens for u in units) / n
    last = sum(u.stages[-1].prompt_tokens for u in units) / n
    out = sum(u.total_output_tokens for u in units) / n / len(units[0].stages)
    return (f"{n} programs of {len(units[0].stages)} stages: prompt tokens {first:.0f} at "
            f"stage 0, {last:.0f} at the last stage (means); {out:.0f} output tokens per stage")
