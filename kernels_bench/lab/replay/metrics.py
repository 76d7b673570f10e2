"""Every replay metric, each formula in one function. Inputs: the run's records.

Per request (LLM call), client side:
  TTFT = first_token_s - send_s
  TPOT = (end_s - first_token_s) / (output_tokens - 1)          calls with > 1 token
Per workflow (errors excluded from every latency and quality metric, and counted):
  E2E           = end_s - arrival_s                      (all attempts)
  E2E per token = E2E / output tokens of the workflow    (Chimera's main metric)
  TTCA          = end of the first correct attempt - arrival_s   (solved workflows)
Per run:
  makespan      = last end - first arrival
  score         = mean of the workflows' trace scores; accuracy = share correct
  expected score = mean of the workflows' expected scores (the final model's mean over
                  its sampled runs; only for a trace with samples)
  solved        = share of workflows with a correct attempt (TTCA defined)
  throughput    = output tokens / makespan
  traffic share = per served model: its share of calls and of output tokens
Engine side (vLLM's counters, summed over engines; ``engine_metrics``):
  queueing time = mean time requests wait in the engines' queues before they are
                  first scheduled
  KV prefix hit rate = prefix-cache hit tokens / queried tokens
Ratios against the baseline: value / baseline value at the same rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kernels_bench.lab.replay.records import RequestRecord, WorkflowRecord
from kernels_bench.lib.engine_metrics import EngineCounters, hit_rate, mean_queue_s

QUANTILES = {"p50": 50, "p95": 95, "p99": 99}


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """Mean, p50, p95, p99 (linear interpolation) and count; None values when empty."""
    xs = np.asarray(list(values), dtype=float)
    if xs.size == 0:
        return {"mean": None, **{k: None for k in QUANTILES}, "n": 0}
    return {"mean": float(xs.mean()),
            **{k: float(np.percentile(xs, q)) for k, q in QUANTILES.items()},
            "n": int(xs.size)}


def ttft(r: RequestRecord) -> float | None:
    """TTFT = first_token_s - send_s."""
    return None if r.first_token_s is None else r.first_token_s - r.send_s


def tpot(r: RequestRecord) -> float | None:
    """TPOT = (end_s - first_token_s) / (output_tokens - 1)."""
    if r.first_token_s is None or r.output_tokens < 2:
        return None
    return (r.end_s - r.first_token_s) / (r.output_tokens - 1)


def e2e(w: WorkflowRecord) -> float:
    """E2E = end_s - arrival_s."""
    return w.end_s - w.arrival_s


def e2e_per_token(w: WorkflowRecord) -> float | None:
    """E2E / output tokens of the workflow."""
    return e2e(w) / w.output_tokens if w.output_tokens > 0 else None


def makespan(workflows: Sequence[WorkflowRecord]) -> float | None:
    """Last end - first arrival."""
    if not workflows:
        return None
    return max(w.end_s for w in workflows) - min(w.arrival_s for w in workflows)


def traffic_share(requests: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    """Per served model: share of calls and share of output tokens."""
    served = [r for r in requests if r.model and r.error is None]
    calls = len(served)
    tokens = sum(r.output_tokens for r in served)
    out: dict[str, dict[str, float]] = {}
    for m in sorted({r.model for r in served}):
        mine = [r for r in served if r.model == m]
        out[m] = {"calls": len(mine) / calls,
                  "tokens": sum(r.output_tokens for r in mine) / tokens if tokens else 0.0}
    return out


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def summarize(requests: Sequence[RequestRecord], workflows: Sequence[WorkflowRecord],
              engines: EngineCounters) -> dict[str, Any]:
    """The run's metrics (see the module docstring)."""
    ok = [w for w in workflows if w.error is None]
    ok_ids = {w.job_id for w in ok}
    calls = [r for r in requests if r.error is None and r.job_id in ok_ids]
    span = makespan(ok)
    out_tokens = sum(w.output_tokens for w in ok)
    expected = _present(w.expected_score for w in ok)
    return {
        "workflows": len(workflows),
        "errors": len(workflows) - len(ok),
        "calls": len(calls),
        "e2e_s": distribution(e2e(w) for w in ok),
        "e2e_per_token_s": distribution(_present(e2e_per_token(w) for w in ok)),
        "makespan_s": span,
        "throughput_tok_s": out_tokens / span if span else None,
        "ttft_s": distribution(_present(ttft(r) for r in calls)),
        "tpot_s": distribution(_present(tpot(r) for r in calls)),
        "queue_s": {"mean": mean_queue_s(engines), "n": int(engines.queue_count)},
        "score": float(np.mean([w.score for w in ok])) if ok else None,
        "accuracy": float(np.mean([w.correct for w in ok])) if ok else None,
        "solved": float(np.mean([w.ttca_s is not None for w in ok])) if ok else None,
        "ttca_s": distribution(_present(w.ttca_s for w in ok)),
        "attempts_mean": float(np.mean([w.attempts for w in ok])) if ok else None,
        "traffic": traffic_share(calls),
        "kv_hit_rate": hit_rate(engines),
        "preemptions": int(engines.preemptions),
        "prompt_token_ratio": _prompt_ratio(calls),
    } | ({"expected_score": float(np.mean(expected))} if expected else {})


def _prompt_ratio(calls: Sequence[RequestRecord]) -> float | None:
    """Engine prompt tokens / trace prompt tokens over the calls (tokenizer difference)."""
    trace = sum(r.trace_prompt_tokens for r in calls)
    return sum(r.prompt_tokens for r in calls) / trace if trace else None


def ratio(value: float | None, base: float | None) -> float | None:
    """value / baseline (None when either is missing or the baseline is 0)."""
    if value is None or base is None or base == 0:
        return None
    return value / base


def lookup(summary: Mapping[str, Any], key: str) -> float | None:
    """A metric by dotted key, e.g. ``e2e_s.mean`` or ``score``."""
    value: Any = summary
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return None if value is None else float(value)
