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
  that served its final stage; its expected score is that model's mean score over its
  sampled runs, where the trace has samples;
- **samples**: where the trace holds sampled runs of a model (docs/research/traces.md), each job
  replays one of them in place of the greedy run (``draw_samples``: a seeded draw per
  job and model, the same for every policy), so lengths, texts and outcome all come from
  that one recorded run; without samples the greedy run is replayed, as always;
- **oracle priority**: the true remaining output tokens of the attempt, from the current
  stage on, if model m serves the rest of it.

The context takes one of two forms (``CONTEXTS``, ``--context``):

- ``trace`` (default): as above, the trace's own messages: each stage opens with its role's
  system prompt, so two stages of a program share no prefix beyond the first few tokens;
- ``chat``: one growing conversation, as an agent framework keeps it: stage 0's messages,
  then for every later stage j the output of stage j-1 (by the model that served it) as
  an assistant turn and stage j's system prompt as a user turn. Each stage's prompt then
  extends the previous one's prompt and output (what KV retention between calls is for);
  the forced lengths and outcomes stay the trace's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from kernels_bench.lib.priors import forced_tokens
from router.predictors.records import Split, seeded_uniform
from router.trace_format import Header, Trace, TraceFormatError, WorkflowRun, unite_workflows


class WorkloadError(ValueError):
    """The trace cannot supply the requested workload."""


@dataclass(frozen=True)
class Job:
    """One workflow of the replay: a trace run and when it arrives."""

    job_id: str
    run: WorkflowRun
    arrival_s: float
    """Seconds after the start of the run."""
    examples: Mapping[str, bool | None] = field(default_factory=dict)
    """Per trace model, whether its final output in ``run`` passes the examples its
    prompt states (``trace.suites.examples_verdicts``; for ``--retry-on examples``
    only)."""

    @property
    def num_stages(self) -> int:
        return len(self.run.roles)


def merge_traces(traces: Sequence[Trace]) -> Trace:
    """One workload of several traces (e.g. math and code: a router must tell the tasks
    apart): runs concatenated, suites joined (``math+code``); WorkloadError when two traces
    hold the same problem or name a workflow differently."""
    if len(traces) == 1:
        return traces[0]
    try:
        workflows = unite_workflows([t.header for t in traces],
                                    [f"trace of suite {t.header.suite!r}" for t in traces])
    except TraceFormatError as e:
        raise WorkloadError(str(e)) from None
    problems: set[str] = set()
    for t in traces:
        ids = {r.problem_id for r in t.runs}
        if ids & problems:
            raise WorkloadError(f"problem {sorted(ids & problems)[0]!r} is in two traces")
        problems |= ids
    first = traces[0].header
    header = Header(format=first.format, version=first.version,
                    suite="+".join(t.header.suite for t in traces), workflows=workflows,
                    settings={t.header.suite: t.header.settings for t in traces},
                    sources=[s for t in traces for s in t.header.sources])
    return Trace(header, [r for t in traces for r in t.runs])


PROBLEMS = ("held-out", "trained", "all")
"""Which problems a replay draws, given the predictor artifacts' splits: those every split
held out (evaluation), those no split held out (tuning settings on the training problems,
never on the evaluated ones), or every problem."""


def select_runs(trace: Trace, models: Sequence[str], n: int, seed: int,
                splits: Sequence[Split] = (), problems: str = "held-out"
                ) -> list[WorkflowRun]:
    """``n`` runs that every one of ``models`` completed, of the ``problems`` (``PROBLEMS``)
    of ``splits``, in a seeded order; when there are fewer, the shuffled list repeats
    (repeated problems share KV prefixes)."""
    runs = trace.complete_runs(models)
    if not runs:
        counts = {m: sum(1 for r in trace.runs if m in r.models) for m in models}
        raise WorkloadError(
            "no workflow run of the trace has every model of the replay ("
            + ", ".join(f"{m}: {c} runs" for m, c in counts.items()) + ")")
    if problems not in PROBLEMS:
        raise WorkloadError(f"--problems {problems!r}: expected one of {', '.join(PROBLEMS)}")
    if problems == "held-out":
        runs = [r for r in runs if all(s.holds_out(r.problem_id) for s in splits)]
    elif problems == "trained":
        runs = [r for r in runs if not any(s.holds_out(r.problem_id) for s in splits)]
    if not runs:
        which = "held out by" if problems == "held-out" else "trained on by"
        raise WorkloadError(f"no problem of the trace is {which} every predictor artifact's "
                            "split; train with another --holdout, or choose other --problems")
    order = list(runs)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(n)]


def draw_samples(run: WorkflowRun, seed: int, job_id: str) -> WorkflowRun:
    """The run job ``job_id`` replays: for every model with sampled runs, one of them in
    place of its greedy run, drawn by ``seeded_uniform(job_id|model, sample<seed>)`` (the
    samples stay, for ``expected_score``); a run without samples unchanged."""
    if not run.samples:
        return run
    models = dict(run.models)
    for model, runs in run.samples.items():
        models[model] = runs[int(seeded_uniform(f"{job_id}|{model}", f"sample{seed}")
                                 * len(runs))]
    return msgspec.structs.replace(run, models=models)


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


CONTEXTS = ("trace", "chat")
"""How a stage's context is built: the trace's messages, or one growing conversation."""


def chat_messages(run: WorkflowRun, stage: int, served: Sequence[str]) -> list[dict[str, str]]:
    """The ``chat`` context of ``stage`` after earlier stages were served by ``served[j]``
    (trace models): stage 0's messages, then per later stage j the output of stage j-1 as
    an assistant turn and stage j's system prompt (else its first message) as a user
    turn."""
    if len(served) != stage:
        raise ValueError(f"stage {stage} needs the models of {stage} earlier stages, "
                         f"got {len(served)}")
    first = next(iter(run.models.values())).stages
    messages = [{"role": m.role, "content": m.content} for m in first[0].messages]
    for j in range(1, stage + 1):
        messages.append({"role": "assistant",
                         "content": run.models[served[j - 1]].stages[j - 1].output_text})
        messages.append({"role": "user", "content": next(
            (m.content for m in first[j].messages if m.role == "system"),
            first[j].messages[0].content)})
    return messages


def context_messages(context: str, run: WorkflowRun, stage: int,
                     served: Sequence[str]) -> list[dict[str, str]]:
    """The messages of ``stage`` in the ``context`` form (``CONTEXTS``)."""
    if context == "chat":
        return chat_messages(run, stage, served)
    if context != "trace":
        raise WorkloadError(f"--context {context!r}: expected one of {', '.join(CONTEXTS)}")
    return stage_messages(run, stage, served)


def outcome(run: WorkflowRun, final_model: str) -> tuple[bool, float]:
    """(correct, score) of an attempt whose final stage ``final_model`` served."""
    mr = run.models[final_model]
    return mr.correct, mr.score


def expected_score(run: WorkflowRun, final_model: str) -> float | None:
    """The mean score of ``final_model``'s sampled runs (None: the trace has none)."""
    return run.expected_score(final_model) if run.samples.get(final_model) else None


def per_model(model_map: Mapping[str, str], fn: Callable[[WorkflowRun, str, int], int],
              run: WorkflowRun, stage: int) -> dict[str, int]:
    """``{served model: fn(run, its trace model, stage)}``."""
    return {served: fn(run, traced, stage) for served, traced in model_map.items()}
