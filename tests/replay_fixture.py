"""A tiny workflow trace for replay tests, built with the trace format's own classes.

Two models, ``small`` and ``large``; problems ``p0..p{n-1}``, each in workflow
``plan_solve`` (planner -> solver) and ``solve`` (solver). Output lengths are distinct
per model, stage and problem, so a test can tell which model served a stage from the
length alone: ``small`` = 10 + 2 x problem + stage, ``large`` = 30 + 2 x problem + stage.
``small`` answers even problems correctly, ``large`` every problem.

With ``samples`` K, every unit also has K sampled runs: sample k is 100 x (k + 1) tokens
longer per stage than the greedy run; ``small``'s sample k is right when problem + k is
even, ``large``'s when k % 3 != 2.
"""

from __future__ import annotations

from pathlib import Path

from kernels_bench.lab.trace.workflows import stage_messages
from router.trace_format import (FORMAT, VERSION, Header, Stage, Trace, TraceWriter,
                                        Unit, load_trace, sample_seed, unit_key)

MODELS = ("small", "large")
WORKFLOWS = {"plan_solve": ["planner", "solver"], "solve": ["solver"]}
BASE = {"small": 10, "large": 30}


def output_tokens(model: str, problem: int, stage: int, sample: int | None = None) -> int:
    return BASE[model] + 2 * problem + stage + (0 if sample is None else 100 * (sample + 1))


def sample_correct(model: str, problem: int, sample: int) -> bool:
    return (problem + sample) % 2 == 0 if model == "small" else sample % 3 != 2


def output_text(model: str, problem: int, stage: int) -> str:
    return f"{model} says {stage} about problem {problem}. " * 3


def unit(model: str, problem: int, workflow: str, sample: int | None = None) -> Unit:
    roles = WORKFLOWS[workflow]
    user = f"What is {problem} + {problem}?"
    stages: list[Stage] = []
    history: list[tuple[str, str]] = []
    for i, role in enumerate(roles):
        text = output_text(model, problem, i)
        stages.append(Stage(index=i, role=role,
                            messages=stage_messages("math", role, user, history),
                            prompt_tokens=40 + 20 * i,
                            output_tokens=output_tokens(model, problem, i, sample),
                            output_text=text, finish_reason="stop", latency_s=0.1))
        history.append((role, text))
    correct = (model == "large" or problem % 2 == 0) if sample is None \
        else sample_correct(model, problem, sample)
    seed = None if sample is None else sample_seed(0, f"p{problem}", workflow, model, sample)
    return Unit(key=unit_key(f"p{problem}", workflow, model, sample), problem_id=f"p{problem}",
                workflow=workflow, model=model, user_prompt=user, reference=str(2 * problem),
                stages=stages, final_answer=str(2 * problem) if correct else "0",
                correct=correct, score=1.0 if correct else 0.0,
                total_output_tokens=sum(s.output_tokens for s in stages), latency_s=0.2,
                sample=sample, seed=seed)


def write_trace(path: Path, problems: int = 4, samples: int = 0) -> Path:
    """Write the fixture trace to ``path`` (``.jsonl`` or ``.jsonl.gz``), with ``samples``
    sampled runs per unit."""
    header = Header(format=FORMAT, version=VERSION, suite="math", workflows=WORKFLOWS,
                    settings={"seed": 0}, sources=[{"name": "fixture", "license": "CC0"}])
    with TraceWriter(path) as w:
        w.append(header)
        for p in range(problems):
            for wf in WORKFLOWS:
                for m in MODELS:
                    w.append(unit(m, p, wf))
                    for k in range(samples):
                        w.append(unit(m, p, wf, k))
    return path


def tiny_trace(tmp: Path, problems: int = 4, samples: int = 0) -> Trace:
    return load_trace(write_trace(tmp / "fixture.jsonl", problems, samples))
