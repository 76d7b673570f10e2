"""``python -m kernels_bench router``: its options, table and files (the benchmark:
``overhead.router``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from kernels_bench.overhead import router as bench
from kernels_bench.overhead.router import (BATCHES, BLOCK, ENGINES, MODELS, STATIC, TRACES, learned,
                                          measure, plot, print_table, summarise)
from router.policies import POLICIES
from router.predictors.loader import close_predictors


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m kernels_bench router", description=bench.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, nargs="+", default=list(ENGINES))
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES),
                    help="round_robin is always included (the ratio's baseline)")
    ap.add_argument("--requests", type=int, default=1000,
                    help="requests measured per policy, cluster size and batch size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--artifacts", type=Path,
                    help="trained predictors (a fold of make artifacts, e.g. artifacts/fold-0)"
                         " for chimera and routebalance instead of static priors")
    ap.add_argument("--data", nargs="+", default=list(TRACES),
                    help="traces whose first-stage prompts the requests carry (--artifacts)")
    ap.add_argument("--out", type=Path, default=Path("bench_results/router"),
                    help="directory for router_bench.json and router_bench.png")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown:
        ap.error(f"unknown policies: {', '.join(unknown)}")
    args.policies = ["round_robin"] + [p for p in args.policies if p != "round_robin"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    pset, models, prompts = learned(args.artifacts, args.data) if args.artifacts \
        else (None, MODELS, [])
    try:
        for n in args.engines:
            for b in args.batches:
                samples = asyncio.run(measure(args.policies, n, b, args.requests, args.seed,
                                              pset, models, prompts))
                rows += summarise(samples, n, b)
                print(f"  measured {n} engines x batch {b} "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
            print_table(rows, n, args.batches)
    finally:
        if pset is not None:
            close_predictors(pset)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "seed": args.seed,
            "requests_per_point": args.requests, "block_size": BLOCK,
            "static_priors": STATIC, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "artifacts": args.artifacts.name if args.artifacts else None,
            "predictor_call_ms": dict(pset.call_ms) if pset else {}}
    (args.out / "router_bench.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                           indent=1))
    plot(rows, args.engines, args.out / "router_bench.png")
    print(f"\nwrote {args.out / 'router_bench.json'} and {args.out / 'router_bench.png'}")
