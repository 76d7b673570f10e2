"""``python -m kernels_bench.lab.twin.queueing DIR... [--pair STJF FCFS]``: STJF against FCFS
with the same router, from the engines' queue time of every call (``queue_s`` of
``requests.jsonl``: engine arrival to first scheduling; the twin records it).

The folders are one replay at one or more seeds, pooled as ``retention.pooled`` pools
them (each folder's runs count as repeats). Pairs: every spec with ``:stjf`` in its label
against the same label with ``:fcfs``, and each ``--pair``. Per pair and rate:

- mean queue per call of each arm (s), as the run summary's ``queue_s.mean``;
- FCFS / STJF of the mean queue per workflow (its calls' queue times summed; the same
  ratio as per call, every workflow making the same calls in both arms), and STJF / FCFS
  of the mean E2E, each with the replay's paired bootstrap over repeats and workflows
  (``replay.intervals.compare``; bold: the interval excludes 1);
- where the FCFS arm's queueing is: the share of its queue time on calls after a
  program's first stage, and on the engine with the most of it;
- what STJF has to order: the spread (p10 / p50 / p90) of the priorities (predicted
  remaining tokens) of the STJF arm's calls that queued at least ``QUEUED_S``.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernels_bench.lab.replay import intervals as iv
from kernels_bench.lab.twin.retention import pooled

QUEUED_S = 1.0
"""A call that waited at least this long in an engine's queue counts as queued."""

Rows = list[Mapping[str, Any]]


def pairs(policies: Sequence[str], named: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(STJF spec, FCFS spec) pairs that ran: each ``:stjf`` label with its ``:fcfs``
    twin, then ``named``."""
    auto = [(p, re.sub(r":stjf\b", ":fcfs", p, count=1)) for p in policies if ":stjf" in p]
    return [(a, b) for a, b in dict.fromkeys([*auto, *named])
            if a in policies and b in policies]


def _matrix(by_job: Mapping[tuple[int, str], float], repeats: Sequence[int],
            jobs: Sequence[str]) -> np.ndarray:
    x = np.full((len(repeats), len(jobs)), np.nan)
    for (rep, job), v in by_job.items():
        x[repeats.index(rep), jobs.index(job)] = v
    return x


def _arm(calls: Rows, flows: Rows) -> dict[str, Any]:
    """One (spec, rate)'s per-workflow queue sums and E2E, keyed by (repeat, job), and its
    calls' queue times, workflows that failed left out."""
    ok = {(w.get("repeat", 0), w["job_id"]): w["end_s"] - w["arrival_s"]
          for w in flows if w.get("error") is None}
    mine = [r for r in calls if (r.get("repeat", 0), r["job_id"]) in ok]
    if any(r.get("queue_s") is None for r in mine):
        raise ValueError("a call has no queue_s (a live replay, or a twin run before it "
                         "was recorded)")
    queue: dict[tuple[int, str], float] = defaultdict(float)
    for r in mine:
        queue[r.get("repeat", 0), r["job_id"]] += r["queue_s"]
    return {"queue": queue, "e2e": ok, "calls": mine}


def _share(calls: Rows, key: Any) -> float | None:
    total = sum(r["queue_s"] for r in calls)
    return sum(r["queue_s"] for r in calls if key(r)) / total if total else None


def analyse(folders: Sequence[Path], named: Sequence[tuple[str, str]] = (),
            seed: int = 0) -> list[dict[str, Any]]:
    """One row per (pair, rate): the values, ratios and diagnostics of the module's
    docstring (JSON-ready)."""
    requests, flows, _, _ = pooled(folders)
    calls: dict[tuple[str, float], Rows] = defaultdict(list)
    runs: dict[tuple[str, float], Rows] = defaultdict(list)
    for r in requests:
        calls[r["policy"], r["rate"]].append(r)
    for w in flows:
        runs[w["policy"], w["rate"]].append(w)
    policies = list(dict.fromkeys(p for p, _ in runs))
    out = []
    for stjf, fcfs in pairs(policies, named):
        for rate in sorted({r for p, r in runs if p == stjf} & {r for p, r in runs if p == fcfs}):
            s, f = (_arm(calls[p, rate], runs[p, rate]) for p in (stjf, fcfs))
            repeats = sorted({k[0] for k in (*s["e2e"], *f["e2e"])})
            jobs = sorted({k[1] for k in (*s["e2e"], *f["e2e"])})
            x = {(arm, m): _matrix(a[m], repeats, jobs)
                 for arm, a in (("s", s), ("f", f)) for m in ("queue", "e2e")}
            q = iv.compare(x["f", "queue"], x["s", "queue"], seed=seed)
            e = iv.compare(x["s", "e2e"], x["f", "e2e"], seed=seed)
            engines: dict[str, float] = defaultdict(float)
            for r in f["calls"]:
                engines[r["engine"]] += r["queue_s"]
            top = max(engines, key=engines.__getitem__) if engines else None
            queued = [r["priority"] for r in s["calls"]
                      if r["queue_s"] >= QUEUED_S and r.get("priority") is not None]
            out.append({
                "stjf": stjf, "fcfs": fcfs, "rate": rate, "repeats": len(repeats),
                "workflows": len(jobs),
                "queue_s": {arm: sum(r["queue_s"] for r in a["calls"]) / len(a["calls"])
                            for arm, a in (("stjf", s), ("fcfs", f)) if a["calls"]},
                "queue_fcfs_over_stjf": _json(q), "e2e_stjf_over_fcfs": _json(e),
                "fcfs_later_stage_share": _share(f["calls"], lambda r: r["stage_index"] > 0),
                "fcfs_top_engine": top,
                "fcfs_top_engine_share": _share(f["calls"], lambda r: r["engine"] == top),
                "stjf_queued_calls": len(queued),
                "stjf_queued_priority_p10_p50_p90": (
                    [float(v) for v in np.percentile(queued, [10, 50, 90])] if queued else None),
            })
    return out


def _json(c: iv.Interval | None) -> dict[str, Any] | None:
    return None if c is None else {"value": c.value, "low": c.low, "high": c.high,
                                   "verdict": iv.verdict(c, False)}


def _ci(v: Mapping[str, Any] | None) -> str:
    if not v:
        return "-"
    text = f"{v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"
    return f"**{text}**" if v["verdict"] == "finding" else text


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The markdown table of ``analyse``'s rows."""
    out = ["| STJF spec / FCFS spec | rate/s | workflows x repeats | queue mean s, STJF / FCFS "
           "| FCFS / STJF queue [95%] | STJF / FCFS E2E [95%] | FCFS queue: later stages "
           f"| FCFS queue: top engine | STJF calls queued >= {QUEUED_S:g} s: priority "
           "p10 / p50 / p90 |", "|" + " --- |" * 9]
    for r in rows:
        q = r["queue_s"]
        pr = r["stjf_queued_priority_p10_p50_p90"]
        spread = "-" if pr is None else " / ".join(f"{v:.0f}" for v in pr)
        out.append(
            f"| {r['stjf']} / {r['fcfs']} | {r['rate']:g} | {r['workflows']} x {r['repeats']} "
            f"| {q.get('stjf', float('nan')):.2f} / {q.get('fcfs', float('nan')):.2f} "
            f"| {_ci(r['queue_fcfs_over_stjf'])} | {_ci(r['e2e_stjf_over_fcfs'])} "
            f"| {_pct(r['fcfs_later_stage_share'])} "
            f"| {r['fcfs_top_engine'] or '-'} {_pct(r['fcfs_top_engine_share'])} "
            f"| {spread} ({r['stjf_queued_calls']} calls) |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.queueing",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+",
                   help="twin replay folders: one replay at one or more seeds")
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("STJF", "FCFS"),
                   help="a further pair of specs to compare (e.g. oracle chimera:fcfs)")
    a = p.parse_args(argv)
    try:
        rows = analyse(a.folders, [tuple(x) for x in a.pair])
    except (ValueError, KeyError) as e:
        raise SystemExit(f"error: {e}") from None
    if not rows:
        raise SystemExit("error: no STJF spec ran beside its FCFS twin (give --pair)")
    print(table(rows))


if __name__ == "__main__":
    main()
