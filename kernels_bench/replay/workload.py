"""The replayed workload: which trace runs, and what each stage sends for a served model.

A trace holds, per workflow run, every model's own run of it (its stages' messages,
output texts and lengths, and whether its final answer was correct). The replay routes
each stage anew, so a stage may go to another model than the one before it. The rules:

- **output length**: a stage served by model m generates exactly m's output length for
  that stage in the trace (``max_tokens`` with ``ignore_eos``; at least 1 token);
- **context**: stage i sends the trace's messages of stage i from the run of the model
  that served stage i-1, with the output text of every earlier stage j that another
  model served replaced by that model's stage-j output (the history holds what was
  actually "said"); stage 0 has no history and is the same for every model;
- **quality**: an attempt is correct, with the trace's score, as the run of the model
  that served its final stage;
- **oracle priority**: the true remaining output tokens of the attempt, from the current
  stage on, if model m serves the rest of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from router.predictors.records import held_out
from router.trace_format import Trace, WorkflowRun


class WorkloadError(ValueError):
    """The trace cannot supply the requested workload."""


@dataclass(frozen=True)
class Job:
    """One workflow of the replay: a trace run and when it arrives."""

    job_id: str
    run: WorkflowRun
    arrival_s: float
    """Seconds after the start of the run."""

    @property
    def num_stages(self) -> int:
        return len(self.run.roles)


def select_runs(trace: Trace, models: Sequence[str], n: int, seed: int,
                splits: Sequence[tuple[int, float]] = ()) -> list[WorkflowRun]:
    """``n`` runs that every one of ``models`` completed, of problems held out by every
    one of ``splits`` ((seed, fraction) of ``held_out``), in a seeded order; when there
    are fewer, the shuffled list repeats (repeated problems share KV prefixes)."""
    runs = trace.complete_runs(models)
    if not runs:
        counts = {m: sum(1 for r in trace.runs if m in r.models) for m in models}
        raise WorkloadError(
            "no workflow run of the trace has every model of the replay ("
            + ", ".join(f"{m}: {c} runs" for m, c in counts.items()) + ")")
    runs = [r for r in runs if all(held_out(r.problem_id, s, f) for s, f in splits)]
    if not runs:
        raise WorkloadError("no problem of the trace is held out by every predictor "
                            "artifact's split; train with --holdout > 0, or replay trained "
                            "problems with --include-trained")
    order = list(runs)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(n)]


def forced_tokens(run: WorkflowRun, model: str, stage: int) -> int:
    """Output tokens stage ``stage`` generates when ``model`` (a trace model) serves it."""
    return max(1, run.models[model].stages[stage].output_tokens)


def remaining_tokens(run: WorkflowRun, model: str, stage: int) -> int:
    """True remaining output tokens from ``stage`` on if ``model`` serves the rest."""
    return sum(forced_tokens(run, model, s) for s in range(stage, len(run.roles)))


def stage_messages(run: WorkflowRun, stage: int, served: Sequence[str]) -> list[dict[str, str]]:
    """The chat messages of ``stage`` after earlier stages were served by ``served[j]``
    (trace models, one per earlier stage)."""
    if len(served) != stage:
        raise ValueError(f"stage {stage} needs the models of {stage} earlier stages, "
                         f"got {len(served)}")
    base = served[-1] if served else next(iter(run.models))
    base_run = run.models[base].stages
    messages = [{"role": m.role, "content": m.content} for m in base_run[stage].messages]
    for j, model in enumerate(served):
        if model == base:
            continue
        old = base_run[j].output_text.strip()
        new = run.models[model].stages[j].output_text.strip()
        if old:
            for m in messages:
                if m["role"] == "user" and old in m["content"]:
                    m["content"] = m["content"].replace(old, new, 1)
                    break
    return messages


def outcome(run: WorkflowRun, final_model: str) -> tuple[bool, float]:
    """(correct, score) of an attempt whose final stage ``final_model`` served."""
    mr = run.models[final_model]
    return mr.correct, mr.score


def per_model(model_map: Mapping[str, str], fn: Callable[[WorkflowRun, str, int], int],
              run: WorkflowRun, stage: int) -> dict[str, int]:
    """``{served model: fn(run, its trace model, stage)}``."""
    return {served: fn(run, traced, stage) for served, traced in model_map.items()}
