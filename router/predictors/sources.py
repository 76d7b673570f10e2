"""Training data by name: ``--data`` values of ``router.train`` and ``router.evaluate``.

- a workflow trace (``router/trace_format.py``, docs/research/traces.md; ``.jsonl[.gz]``
  whose first line is the trace header): every stage of every model's run;
- a stage-records file (``records.write_jsonl``);
- ``synthetic:N``: the SYNTHETIC fixture over N math and up to N code problems
  (``synthetic``);
- for ``tpot``: telemetry logs (``telemetry_log``) or ``synthetic-telemetry:N``.

Training is an offline tool; the router process itself only loads artifacts.
"""

from __future__ import annotations

import gzip
import json
import dataclasses
from pathlib import Path
from typing import Mapping, Sequence

from router.predictors.encoder import MINILM, TokenCounter, load_tokenizer, resolve_encoder
from router.predictors.records import StageRecord, read_jsonl
from router.predictors.synthetic import synthetic_telemetry, synthetic_workflows
from router.predictors.tpot import TpotSample, read_telemetry_log, samples
from router.trace_format import load_trace

SYNTHETIC = "synthetic:"
SYNTHETIC_TELEMETRY = "synthetic-telemetry:"


def _first_line(path: Path) -> dict[str, object]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        line = f.readline()
    try:
        first = json.loads(line)
    except json.JSONDecodeError:
        raise ValueError(f"{path.name}: line 1 is not JSON") from None
    return first if isinstance(first, dict) else {}


def _count(spec: str, prefix: str) -> int:
    try:
        return int(spec[len(prefix):])
    except ValueError:
        raise ValueError(f"--data {spec!r}: expected {prefix}<count>") from None


def trace_records(path: Path) -> list[StageRecord]:
    """Every stage of every model's greedy run in a workflow trace; where the model also
    has sampled runs of that workflow, ``p_correct`` is their share of correct ones."""
    trace = load_trace(path)
    out = []
    for run in trace.runs:
        for model, mr in run.models.items():
            for st in mr.stages:
                out.append(StageRecord(
                    problem_id=run.problem_id, run_id=f"{run.problem_id}|{run.workflow}|{model}",
                    workflow=run.workflow, stage=st.role, stage_index=st.index,
                    num_stages=len(mr.stages), model=model,
                    system_text="\n".join(m.content for m in st.messages if m.role == "system"),
                    user_text=next((m.content for m in reversed(st.messages)
                                    if m.role == "user"), ""),
                    prompt_text="\n\n".join(f"{m.role}: {m.content}" for m in st.messages),
                    prompt_tokens=st.prompt_tokens, output_tokens=st.output_tokens,
                    remaining_tokens=mr.remaining_output_tokens(st.index),
                    correct=mr.correct, task=trace.header.suite,
                    p_correct=run.p_correct(model) if run.samples.get(model) else None))
    return out


def load_records(specs: Sequence[str]) -> list[StageRecord]:
    """The stage records of every ``--data`` value, concatenated."""
    out: list[StageRecord] = []
    for spec in specs:
        if spec.startswith(SYNTHETIC):
            counter = TokenCounter(load_tokenizer(resolve_encoder(MINILM)))
            out += synthetic_workflows(_count(spec, SYNTHETIC), counter)
            continue
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--data {spec!r}: no such file (or use {SYNTHETIC}N)")
        out += trace_records(path) if _first_line(path).get("kind") == "header" \
            else list(read_jsonl(path))
    return out


def parse_model_map(items: Sequence[str]) -> dict[str, str]:
    """``["a=X,b=Y", "c=Z"]`` -> ``{"a": "X", "b": "Y", "c": "Z"}`` (served -> trace model);
    ValueError naming a malformed or repeated item."""
    out: dict[str, str] = {}
    for item in (p.strip() for text in items for p in text.split(",")):
        if not item:
            continue
        served, eq, traced = (s.strip() for s in item.partition("="))
        if not (eq and served and traced):
            raise ValueError(f"{item!r}: expected SERVED=TRACE_MODEL")
        if served in out:
            raise ValueError(f"{served!r} is mapped twice")
        out[served] = traced
    return out


def serve_as(records: Sequence[StageRecord], model_map: Mapping[str, str]
             ) -> list[StageRecord]:
    """The records of the mapped trace models only, each renamed to the served model that
    replays it (``model_map``: served -> trace model), so that an artifact knows the
    cluster's model names; ValueError when a trace model has no record."""
    by_trace = {traced: served for served, traced in model_map.items()}
    if len(by_trace) != len(model_map):
        raise ValueError("model map: two served models replay the same trace model")
    missing = sorted(set(by_trace) - {r.model for r in records})
    if missing:
        raise ValueError(f"model map: no record of {', '.join(missing)} in the data")
    return [dataclasses.replace(r, model=by_trace[r.model],
                                run_id=f"{r.run_id.rpartition('|')[0]}|{by_trace[r.model]}")
            for r in records if r.model in by_trace]


def load_tpot_samples(specs: Sequence[str]) -> list[TpotSample]:
    """TPOT samples of every telemetry log (or synthetic telemetry) given."""
    snaps = []
    for spec in specs:
        if spec.startswith(SYNTHETIC_TELEMETRY):
            snaps += synthetic_telemetry(_count(spec, SYNTHETIC_TELEMETRY))
        elif Path(spec).is_file():
            snaps += read_telemetry_log(spec)
        else:
            raise ValueError(f"--data {spec!r}: no such file (or use {SYNTHETIC_TELEMETRY}N)")
    return samples(snaps)
