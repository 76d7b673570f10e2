#!/usr/bin/env python3
"""Routing decisions of two checkouts, interleaved: ``python -m kernels_bench router`` run in
ABBA order in a ``--before`` and an ``--after`` checkout (each with its own ``.venv`` and
``artifacts``), then per (policy, engines, batch) the after/before ratio of p50 and p99 as
a geometric mean over the pairs with a 95% t interval, and the p50 ratio normalised by each
run's own round robin p50 (round robin is the noise's yardstick).

    python -m kernels_bench.lab.studies.router_ab --before ../main --after . --pairs 4
        --out bench_results/router-ab
    python -m kernels_bench.lab.studies.router_ab --report bench_results/router-ab  # the table

Each run's JSON stays in ``--out`` (``before-K``, ``after-K``); a rerun with the same
``--out`` skips the runs already there, so a killed comparison resumes. The summary goes
to ``--out/ab.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from scipy import stats
from tqdm import tqdm

BENCH = ["-m", "kernels_bench", "router", "--artifacts", "artifacts/fold-0", "--policies",
         "chimera", "routebalance", "lmetric", "--engines", "2", "16", "64", "--batches",
         "1", "16", "--requests", "400"]


def order(pairs: int) -> list[str]:
    """ABBA: before, after, after, before, ..."""
    return [side for k in range(pairs)
            for side in (("before", "after") if k % 2 == 0 else ("after", "before"))]


def run(tree: Path, out: Path) -> None:
    python = tree / ".venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        done = subprocess.run([str(python), *BENCH, "--out", str(out)], cwd=tree, env=env,
                              stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{tree}: the benchmark failed (rc {done.returncode}); see {log}")


def rows(path: Path) -> dict[tuple[str, int, int], dict[str, float]]:
    data = json.loads((path / "router_bench.json").read_text())
    data = data["rows"] if isinstance(data, dict) else data
    return {(r["policy"], r["engines"], r["batch"]): r for r in data}


def geo_interval(ratios: list[float]) -> list[float]:
    """Geometric mean and its 95% t interval."""
    logs = [math.log(r) for r in ratios]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return [round(math.exp(m), 3)] * 3
    h = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return [round(math.exp(m), 3), round(math.exp(m - h), 3), round(math.exp(m + h), 3)]


def report(out: Path) -> dict[str, object]:
    runs = sorted(p for p in out.iterdir() if (p / "router_bench.json").is_file())
    pairs = min(sum(p.name.startswith(s) for p in runs) for s in ("before-", "after-"))
    if pairs == 0:
        raise SystemExit(f"{out}: no finished pair of runs")
    before = [rows(out / f"before-{k}") for k in range(1, pairs + 1)]
    after = [rows(out / f"after-{k}") for k in range(1, pairs + 1)]
    cells = []
    print("policy        engines batch | p50 before  after | after/before p50 [95%] "
          "| rr-normalised [95%] | p99 before  after | after/before p99 [95%]")
    for key in sorted(before[0], key=lambda k: (k[2], k[0] != "round_robin", k[0], k[1])):
        policy, engines, batch = key
        rr = ("round_robin", engines, batch)
        b50 = [r[key]["p50_us"] for r in before]
        a50 = [r[key]["p50_us"] for r in after]
        b99 = [r[key]["p99_us"] for r in before]
        a99 = [r[key]["p99_us"] for r in after]
        norm = [(a[key]["p50_us"] / a[rr]["p50_us"]) / (b[key]["p50_us"] / b[rr]["p50_us"])
                for a, b in zip(after, before)]
        cell = {"policy": policy, "engines": engines, "batch": batch,
                "before_p50_us": round(statistics.median(b50), 1),
                "after_p50_us": round(statistics.median(a50), 1),
                "before_p99_us": round(statistics.median(b99), 1),
                "after_p99_us": round(statistics.median(a99), 1),
                "ratio_p50": geo_interval([a / b for a, b in zip(a50, b50)]),
                "ratio_p50_rr_normalised": geo_interval(norm),
                "ratio_p99": geo_interval([a / b for a, b in zip(a99, b99)]),
                "before_p50_runs": b50, "after_p50_runs": a50}
        cells.append(cell)
        print(f"{policy:13s} {engines:7d} {batch:5d} | {cell['before_p50_us']:10,.0f} "
              f"{cell['after_p50_us']:6,.0f} | {cell['ratio_p50']} | "
              f"{cell['ratio_p50_rr_normalised']} | {cell['before_p99_us']:10,.0f} "
              f"{cell['after_p99_us']:6,.0f} | {cell['ratio_p99']}")
    summary: dict[str, object] = {"command": "python " + " ".join(BENCH), "pairs": pairs,
                                  "order": order(pairs), "cells": cells}
    (out / "ab.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out / 'ab.json'}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="checkout measured as before")
    ap.add_argument("--after", type=Path, help="checkout measured as after")
    ap.add_argument("--pairs", type=int, default=4, help="ABBA pairs (default 4)")
    ap.add_argument("--out", type=Path, default=Path("bench_results/router-ab"))
    ap.add_argument("--report", type=Path, help="only print the table of a finished --out")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return
    if not (args.before and args.after) or args.pairs < 1:
        ap.error("give --before and --after checkouts and --pairs >= 1 (or --report DIR)")
    for tree in (args.before, args.after):
        if not (tree / ".venv" / "bin" / "python").exists() or not (tree / "artifacts").is_dir():
            ap.error(f"{tree}: needs its own .venv and artifacts (make setup; make artifacts)")
    args.out.mkdir(parents=True, exist_ok=True)
    counts = {"before": 0, "after": 0}
    todo = []
    for side in order(args.pairs):
        counts[side] += 1
        target = args.out / f"{side}-{counts[side]}"
        if not (target / "router_bench.json").is_file():
            todo.append((side, target))
    for side, target in tqdm(todo, desc="router A/B runs", unit="run"):
        run((args.before if side == "before" else args.after).resolve(), target.resolve())
    report(args.out)


if __name__ == "__main__":
    sys.exit(main())
