"""Paired comparisons of replay (or twin) runs on the same workflows, and each policy's
distance to the random router's curve (issue 30, item 5).

    python -m kernels_bench.lab.studies.frontier_gap RUN [RUN ...] [--big tiny-b]
        [--baseline RUN:POLICY] [--pool | --pool-seeds] [--boot 2000] [--json FILE]
                                   [--plot FILE]

Every RUN is a replay's output folder (``workflows.jsonl``, ``requests.jsonl``) of the same
workflows: the same trace, ``--seed``, ``--workflows`` and ``--artifacts``, so the same job
ids in each fold replay the same runs. For every (RUN, policy) at each rate:

- **score** (points, the trace's score of each workflow's final attempt), **mean E2E**
  and **E2E per output token** (over every attempt: a retried workflow pays for both);
- **big share**: the share of its calls on ``--big``;
- **minus the mix curve**: its score minus the score of that RUN's ``random_mix`` runs
  at the same big share, linear between the two mixes around it (nothing when its share
  lies outside the mixes' range): above the curve is better than a random choice that
  sends as many calls to the big model;
- against ``--baseline`` (default: ``vllm:fcfs`` of the first RUN): the score difference
  (points) and the mean E2E and E2E-per-token ratios.

Intervals: 95% percentile bootstrap over problems (every workflow of a drawn problem, in
every run and fold, drawn together: the comparisons are paired). Repeats are pooled;
``--pool`` pools the RUNs too, as repeats of one run (e.g. the same command at several
``--seed``: other arrivals and sample draws of the same problems), named ``pooled``;
``--pool-seeds`` pools only the RUNs whose folder names differ in a trailing ``-seedN``,
each group named by what precedes it, so that one policy pooled over its seeds can be the
``--baseline`` of another group's (two artifact sets on the same problems). A comparison
is a finding when its interval excludes no difference.

``--plot FILE`` draws the table (one row of panels per rate): score against big share,
the random mixes joined as their curve; and score minus the baseline against E2E per
token over the baseline's, with issue 30's serving target (at least +5 points at no more
than 1.0x) shaded. Bars: the 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIX = "random_mix"
SEED = re.compile(r"-seed\d+$")
"""A run folder's seed suffix (``--pool-seeds``)."""
TARGET_POINTS, TARGET_RATIO = 5.0, 1.0
"""Issue 30's serving target, shaded in ``--plot``: at least this many points over the
baseline at no more than this E2E per token over the baseline's."""


@dataclass
class Series:
    """One (run, policy, rate): per workflow key (fold, job, repeat), its numbers."""

    label: str
    keys: list[tuple[int, str, int]]
    problem: np.ndarray
    score: np.ndarray
    e2e: np.ndarray
    tokens: np.ndarray
    calls: np.ndarray
    big_calls: np.ndarray


ARRAYS = ("problem", "score", "e2e", "tokens", "calls", "big_calls")
"""``Series``' per-workflow arrays, in field order."""


def read_jsonl(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def load(run: Path, big: str) -> dict[tuple[str, float], Series]:
    """The run's series by (policy, rate); failed workflows are left out."""
    calls: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in read_jsonl(run / "requests.jsonl"):
        c = calls[r["policy"], r["rate"], r.get("fold", 0), r["job_id"], r["repeat"]]
        c[0] += 1
        c[1] += r["model"] == big
    rows: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for w in read_jsonl(run / "workflows.jsonl"):
        if w.get("error") is None:
            rows[w["policy"], w["rate"]].append(w)
    out = {}
    for (policy, rate), ws in rows.items():
        ws.sort(key=lambda w: (w.get("fold", 0), w["job_id"], w["repeat"]))
        n = [calls[policy, rate, w.get("fold", 0), w["job_id"], w["repeat"]] for w in ws]
        out[policy, rate] = Series(
            f"{run.name}: {policy}", [(w.get("fold", 0), w["job_id"], w["repeat"]) for w in ws],
            np.array([w["problem_id"] for w in ws]), np.array([100.0 * w["score"] for w in ws]),
            np.array([w["end_s"] - w["arrival_s"] for w in ws]),
            np.array([max(1, w["output_tokens"]) for w in ws], dtype=float),
            np.array([c[0] for c in n], dtype=float), np.array([c[1] for c in n], dtype=float))
    return out


def pooled(runs: Sequence[dict[tuple[str, float], Series]], name: str = "pooled"
           ) -> dict[tuple[str, float], Series]:
    """The runs' series as one run's: per (policy, rate) the rows of every run that has it,
    the i-th run's repeats numbered after the earlier runs' (labels ``NAME: policy``)."""
    parts: dict[tuple[str, float], list[tuple[int, Series]]] = defaultdict(list)
    for i, run in enumerate(runs):
        for key, s in run.items():
            parts[key].append((i, s))
    return {key: Series(f"{name}: {key[0]}",
                        [(fold, job, i * 1_000_000 + rep) for i, s in ss
                         for fold, job, rep in s.keys],
                        *(np.concatenate([getattr(s, f) for _, s in ss]) for f in ARRAYS))
            for key, ss in parts.items()}


def stats(s: Series, idx: np.ndarray) -> np.ndarray:
    """[score, mean E2E, E2E per token, big share] of the rows ``idx``."""
    return np.array([s.score[idx].mean(), s.e2e[idx].mean(),
                     (s.e2e[idx] / s.tokens[idx]).mean(),
                     s.big_calls[idx].sum() / max(1.0, s.calls[idx].sum())])


def curve_gap(point: np.ndarray, mixes: list[np.ndarray]) -> float:
    """Score minus the mixes' curve at the point's big share (NaN outside their range)."""
    pts = sorted((m[3], m[0]) for m in mixes)
    share, score = point[3], point[0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= share <= x1 and x1 > x0:
            return float(score - (y0 + (y1 - y0) * (share - x0) / (x1 - x0)))
    return float("nan")


def interval(values: np.ndarray) -> tuple[float, float]:
    ok = values[~np.isnan(values)]
    if len(ok) < 0.9 * len(values):  # the gap left the mixes' range in many draws
        return float("nan"), float("nan")
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return float(lo), float(hi)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--big", default="tiny-b", help="the big model's served name")
    p.add_argument("--baseline", help="RUN:POLICY (default: vllm:fcfs of the first RUN)")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--pool", action="store_true",
                      help="pool the RUNs as repeats of one run, named 'pooled'")
    pool.add_argument("--pool-seeds", action="store_true",
                      help="pool the RUNs named alike but for a trailing -seedN, each group "
                           "named without it")
    p.add_argument("--boot", type=int, default=2000)
    p.add_argument("--json", type=Path, help="also write the table here")
    p.add_argument("--plot", type=Path, help="also draw the table here (PNG)")
    a = p.parse_args(argv)
    missing = [str(r / f) for r in a.runs for f in ("workflows.jsonl", "requests.jsonl")
               if not (r / f).is_file()]
    if missing or a.boot < 1:
        p.error(f"not a replay's output: {missing[0]} is missing" if missing
                else "--boot must be at least 1")
    for flag, out in (("--json", a.json), ("--plot", a.plot)):
        if out is not None and not out.parent.is_dir():
            p.error(f"{flag} {out}: no folder {out.parent} to write it in")
    runs = {r.name: load(r, a.big) for r in a.runs}
    if a.pool:
        runs = {"pooled": pooled(list(runs.values()))}
    elif a.pool_seeds:
        groups: dict[str, list[dict[tuple[str, float], Series]]] = defaultdict(list)
        for name, run in runs.items():
            groups[SEED.sub("", name)].append(run)
        runs = {name: pooled(group, name) for name, group in groups.items()}
    base_run, base_policy = (a.baseline.split(":", 1) if a.baseline
                             else (next(iter(runs)), "vllm:fcfs"))
    if not any(pol == base_policy for pol, _ in runs.get(base_run, {})):
        p.error(f"baseline {base_run}:{base_policy} not found; runs: {', '.join(runs)}")
    rates = sorted({rate for series in runs.values() for _, rate in series})
    problems = sorted({pr for series in runs.values() for s in series.values()
                       for pr in s.problem})
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(problems), len(problems)) for _ in range(a.boot)]
    rows_of = {s.label: {pr: np.flatnonzero(s.problem == pr) for pr in problems}
               for series in runs.values() for s in series.values()}

    def pick(s: Series, draw: np.ndarray | None) -> np.ndarray:
        by = rows_of[s.label]
        chosen = range(len(problems)) if draw is None else draw
        return np.concatenate([by[problems[i]] for i in chosen])

    table = []
    for rate in rates:
        if (base_policy, rate) not in runs[base_run]:
            p.error(f"baseline {base_run}:{base_policy} has no run at {rate:g}/s")
        base = runs[base_run][base_policy, rate]
        for run_name, series in runs.items():
            mixes = [s for (pol, r), s in series.items() if r == rate and pol.startswith(MIX)]
            for (policy, r), s in sorted(series.items()):
                if r != rate:
                    continue
                values = []
                for draw in [None, *draws]:
                    x, b = stats(s, pick(s, draw)), stats(base, pick(base, draw))
                    gap = (curve_gap(x, [stats(m, pick(m, draw)) for m in mixes])
                           if mixes and not policy.startswith(MIX) else np.nan)
                    values.append([*x, gap, x[0] - b[0], x[1] / b[1], x[2] / b[2]])
                v = np.array(values)
                names = ["score", "e2e_s", "e2e_per_token_s", "big_share", "minus_mix_curve",
                         "score_minus_baseline", "e2e_ratio", "e2e_per_token_ratio"]
                row = {"run": run_name, "policy": policy, "rate": rate,
                       "workflows": len(s.keys)}
                for j, name in enumerate(names):
                    lo, hi = interval(v[1:, j])
                    row[name] = {"value": float(v[0, j]), "lo": lo, "hi": hi}
                table.append(row)
    print(f"baseline: {base_run}: {base_policy}; 95% intervals over {len(problems)} problems "
          f"({a.boot} draws)\n")
    print("| run | policy | rate | big share | score | minus mix curve | score - baseline "
          "| E2E s | E2E ratio | E2E/token ratio |\n|---|---|---|---|---|---|---|---|---|---|")

    def ci(v: dict, fmt: str) -> str:
        if np.isnan(v["value"]):
            return "-"
        if np.isnan(v["lo"]):
            return format(v["value"], fmt)
        return f"{v['value']:{fmt}} [{v['lo']:{fmt}}, {v['hi']:{fmt}}]"

    for row in table:
        print(f"| {row['run']} | {row['policy']} | {row['rate']:g} | "
              f"{row['big_share']['value']:.3f} | {ci(row['score'], '.1f')} | "
              f"{ci(row['minus_mix_curve'], '+.1f')} | "
              f"{ci(row['score_minus_baseline'], '+.1f')} | {ci(row['e2e_s'], '.2f')} | "
              f"{ci(row['e2e_ratio'], '.2f')} | {ci(row['e2e_per_token_ratio'], '.2f')} |")
    if a.json:  # standard JSON: null where a value is not defined (a mix's own gap)
        a.json.write_text(json.dumps(_nulls(table), indent=1, allow_nan=False))
    if a.plot:
        plot(table, base_policy if len(runs) == 1 else f"{base_run}: {base_policy}", a.plot)


def plot(table: list[dict], baseline: str, path: Path) -> None:
    """``--plot``: per rate, score against big share (the mixes joined as their curve)
    and score minus the baseline against E2E per token over the baseline's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({row["rate"] for row in table})
    fig, axes = plt.subplots(len(rates), 2, figsize=(12, 4.8 * len(rates)), squeeze=False)
    runs = len({row["run"] for row in table})
    for (share_ax, target_ax), rate in zip(axes, rates):
        rows = [row for row in table if row["rate"] == rate]
        for run in dict.fromkeys(row["run"] for row in rows):
            mixes = sorted((row for row in rows if row["run"] == run
                            and row["policy"].startswith(MIX)),
                           key=lambda row: row["big_share"]["value"])
            share_ax.plot([m["big_share"]["value"] for m in mixes],
                          [m["score"]["value"] for m in mixes], "k--", marker="s", ms=4,
                          label="random mix" + (f" ({run})" if runs > 1 else ""))
        for row in (row for row in rows if not row["policy"].startswith(MIX)):
            label = row["policy"] if runs == 1 else f"{row['run']}: {row['policy']}"
            dot = _dot(share_ax, row["big_share"], row["score"], label)
            _dot(target_ax, row["e2e_per_token_ratio"], row["score_minus_baseline"], None,
                 dot.lines[0].get_color())
        share_ax.set(xlabel="share of calls on the big model", ylabel="score (points)",
                     title=f"{rate:g} workflows/s: score against the big model's share")
        share_ax.legend(fontsize=6, loc="upper left")
        x_lo, y_hi = target_ax.get_xlim()[0], target_ax.get_ylim()[1]
        target_ax.fill_between([min(x_lo, TARGET_RATIO - 0.01), TARGET_RATIO],
                               TARGET_POINTS, max(y_hi, TARGET_POINTS + 1), color="tab:green",
                               alpha=0.15, label="the serving target")
        target_ax.axhline(0, color="grey", lw=0.8)
        target_ax.axvline(1, color="grey", lw=0.8)
        target_ax.set(xlabel=f"E2E per output token / {baseline}'s",
                      ylabel=f"score minus {baseline} (points)",
                      title="against the baseline (95% intervals)")
        target_ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _dot(ax: Any, x: dict, y: dict, label: str | None, color: str | None = None) -> Any:
    """One point with its intervals on both axes (none where an end is undefined)."""
    def err(v: dict) -> Any:
        if np.isnan(v["lo"]):
            return None
        return [[v["value"] - v["lo"]], [v["hi"] - v["value"]]]
    return ax.errorbar([x["value"]], [y["value"]], xerr=err(x), yerr=err(y), fmt="o",
                       ms=5, capsize=3, label=label, color=color)


def _nulls(o: Any) -> Any:
    """``o`` with every NaN float replaced by None."""
    if isinstance(o, dict):
        return {k: _nulls(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_nulls(v) for v in o]
    return None if isinstance(o, float) and math.isnan(o) else o


if __name__ == "__main__":
    main()
