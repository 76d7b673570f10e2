"""Confidence intervals of a replay: a paired, two-level bootstrap over repeats and
workflows.

Every policy replays the same workflows (job ids) at the same arrival times, once per
repeat, the policies interleaved within each repeat. For one (policy, rate) a per-workflow
metric is a matrix ``x[repeat, workflow]`` (NaN where the workflow failed: failures are
counted apart and excluded from every metric, as in ``metrics``).

- value:  ``nanmean(x)`` (or a percentile of the pooled values);
- ratio against the baseline B: ``value(x_A) / value(x_B)``;
- difference: ``value(x_A) - value(x_B)`` (scores, in points).

Interval: percentile bootstrap, ``BOOTSTRAP_DRAWS`` draws, 95%. A draw resamples the repeats
and the workflows with replacement and applies the same indices to A and B (paired: repeat
i of A and B ran side by side, workflow j is the same problem at the same arrival time), so
both the run-to-run noise of the machine and the choice of workflows are in the interval.
A cross-fitted replay runs each fold's workflows in runs of their own: the repeats are
resampled per fold (stratum), independently, so each of the folds x repeats runs counts
as one unit of run-to-run noise.
A comparison is a *finding* when its interval excludes no-difference (1 for a ratio, 0 for
a difference), else *unresolved*.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kernels_bench.lab.replay.metrics import e2e, e2e_per_token
from kernels_bench.lab.replay.records import WorkflowRecord, from_row

BOOTSTRAP_DRAWS = 2000
CONFIDENCE = 0.95

Stat = Callable[[np.ndarray], np.ndarray]
"""Reduces the last two axes (repeats, workflows) of an array of draws, NaN-aware."""


def mean(x: np.ndarray) -> np.ndarray:
    return np.nanmean(x, axis=(-2, -1))


def p95(x: np.ndarray) -> np.ndarray:
    return np.nanpercentile(x.reshape(*x.shape[:-2], -1), 95, axis=-1)


@dataclasses.dataclass(frozen=True)
class Metric:
    """A per-workflow metric of the interval table."""

    key: str
    name: str
    value: Callable[[WorkflowRecord], float | None]
    """Its value for one workflow record (None: not defined for it)."""
    stat: Stat = mean
    difference: bool = False
    """Compared as a difference (scores) rather than a ratio (latencies)."""
    optional: bool = False
    """Left out of a summary in which no workflow has a value (expected score: only a
    trace with samples has one)."""


METRICS = (
    Metric("e2e_s.mean", "E2E mean (s)", e2e),
    Metric("e2e_s.p95", "E2E p95 (s)", e2e, p95),
    Metric("e2e_per_token_s.mean", "E2E/token (s)", e2e_per_token),
    Metric("score", "score (points)", lambda w: 100.0 * w.score, difference=True),
    Metric("expected_score", "expected score (points)",
           lambda w: None if w.expected_score is None else 100.0 * w.expected_score,
           difference=True, optional=True),
)
"""The formulas are ``metrics``'; scores in points (100 x the trace's score; expected:
the final model's mean over its sampled runs, the same decisions with less variance)."""


def metrics_of(records: Iterable[WorkflowRecord]) -> list[Metric]:
    """``METRICS`` less the optional ones no record has a value of."""
    rows = list(records)
    return [m for m in METRICS
            if not m.optional or any(m.value(w) is not None for w in rows)]


@dataclasses.dataclass(frozen=True)
class Interval:
    """A statistic and its 95% bootstrap interval."""

    value: float
    low: float
    high: float


def strata(folds: Mapping[str, int], jobs: Sequence[str]) -> np.ndarray:
    """Per job (in ``jobs``' order), the index of its fold among the folds that ran."""
    order = {f: i for i, f in enumerate(sorted({folds[j] for j in jobs}))}
    return np.array([order[folds[j]] for j in jobs], dtype=np.intp)


def matrix(workflows: Iterable[tuple[int, WorkflowRecord]], metric: Metric,
           repeats: Sequence[int], jobs: Sequence[str]) -> np.ndarray:
    """``x[repeat, workflow]`` from one (policy, rate)'s (repeat, record) pairs; NaN where
    a workflow failed, has no value, or was not run."""
    x = np.full((len(repeats), len(jobs)), np.nan)
    r_at = {r: i for i, r in enumerate(repeats)}
    j_at = {j: i for i, j in enumerate(jobs)}
    for repeat, w in workflows:
        if w.error is None and w.job_id in j_at and repeat in r_at:
            v = metric.value(w)
            if v is not None:
                x[r_at[repeat], j_at[w.job_id]] = v
    return x


def _draws(shape: tuple[int, int], seed: int, fold_of: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """(repeat, workflow) indices of every draw: workflows resampled among all, repeats
    resampled per fold (``fold_of``: each job's stratum; None: one) and the draw of the
    drawn job's fold used for it."""
    rng = np.random.default_rng(seed)
    r, w = shape
    folds = 1 if fold_of is None or not len(fold_of) else int(fold_of.max()) + 1
    ri = rng.integers(0, r, (BOOTSTRAP_DRAWS, r, folds))
    wi = rng.integers(0, w, (BOOTSTRAP_DRAWS, 1, w))
    if fold_of is not None and folds > 1:
        ri = np.take_along_axis(ri, np.broadcast_to(fold_of[wi], (BOOTSTRAP_DRAWS, r, w)), 2)
    return ri, wi


def _bounds(samples: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.nanpercentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def interval(x: np.ndarray, stat: Stat = mean, seed: int = 0,
             fold_of: np.ndarray | None = None) -> Interval | None:
    """The statistic of ``x`` with its bootstrap interval; None if ``x`` holds no value.
    ``fold_of``: each workflow's fold (``strata``) in a cross-fitted replay."""
    if np.isnan(x).all():
        return None
    ri, wi = _draws(x.shape, seed, fold_of)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN draws: skipped below
        samples = stat(x[ri, wi])
    return Interval(float(stat(x[None])[0]), *_bounds(samples))


def compare(a: np.ndarray, b: np.ndarray, stat: Stat = mean, difference: bool = False,
            seed: int = 0, fold_of: np.ndarray | None = None) -> Interval | None:
    """``stat(a) / stat(b)`` (or ``-``) with its paired bootstrap interval; ``a`` and
    ``b`` have the same shape (same repeats, same workflows)."""
    if a.shape != b.shape:
        raise ValueError(f"unpaired comparison: shapes {a.shape} and {b.shape}")
    if np.isnan(a).all() or np.isnan(b).all():
        return None
    ri, wi = _draws(a.shape, seed, fold_of)

    def of(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
        return sa - sb if difference else sa / sb

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN draws: skipped below
        samples = of(stat(a[ri, wi]), stat(b[ri, wi]))
        value = float(of(stat(a[None]), stat(b[None]))[0])
    return Interval(value, *_bounds(samples))


def verdict(c: Interval, difference: bool) -> str:
    """``finding`` when the interval excludes no-difference, else ``unresolved``."""
    null = 0.0 if difference else 1.0
    return "finding" if c.low > null or c.high < null else "unresolved"



def pairs_to_compare(policies: Sequence[str], baseline: str,
                     named: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every policy against the baseline (if it ran), then the ``named`` pairs of policies
    that ran, each once."""
    out = [(p, baseline) for p in policies if p != baseline and baseline in policies]
    out += [(a, b) for a, b in named if a in policies and b in policies]
    return list(dict.fromkeys(out))


def summarize(workflows: Sequence[Mapping[str, Any]], baseline: str,
              named: Iterable[tuple[str, str]] = (), seed: int = 0) -> dict[str, Any]:
    """Intervals of every (policy, rate) and comparisons of every pair at each rate, from
    the workflow records of a replay (``workflows.jsonl``). JSON-ready: ``values`` and
    ``comparisons`` are lists of rows."""
    runs: dict[tuple[str, float], list[tuple[int, WorkflowRecord]]] = {}
    folds: dict[str, int] = {}
    for w in workflows:
        runs.setdefault((w["policy"], w["rate"]), []).append(
            (w.get("repeat", 0), from_row(WorkflowRecord, w)))
        folds[w["job_id"]] = w.get("fold", 0)
    policies = list(dict.fromkeys(p for p, _ in runs))
    metrics = metrics_of(w for pairs in runs.values() for _, w in pairs)
    values, comparisons = [], []
    for rate in sorted({r for _, r in runs}):
        here = [p for p in policies if (p, rate) in runs]
        repeats = sorted({r for p in here for r, _ in runs[p, rate]})
        jobs = sorted({w.job_id for p in here for _, w in runs[p, rate]})
        fold_of = strata(folds, jobs)
        x = {(p, m.key): matrix(runs[p, rate], m, repeats, jobs) for p in here
             for m in metrics}
        for p in here:
            row: dict[str, Any] = {"policy": p, "rate": rate, "repeats": len(repeats)}
            for m in metrics:
                row[m.key] = _json(interval(x[p, m.key], m.stat, seed, fold_of))
            values.append(row)
        for a, b in pairs_to_compare(here, baseline, named):
            row = {"policy": a, "against": b, "rate": rate}
            for m in metrics:
                c = compare(x[a, m.key], x[b, m.key], m.stat, m.difference, seed, fold_of)
                row[m.key] = None if c is None else {
                    **_json(c), "verdict": verdict(c, m.difference)}
            comparisons.append(row)
    return {"draws": BOOTSTRAP_DRAWS, "confidence": CONFIDENCE, "values": values,
            "comparisons": comparisons}


def _json(i: Interval | None) -> dict[str, float] | None:
    return None if i is None else {"value": i.value, "low": i.low, "high": i.high}
