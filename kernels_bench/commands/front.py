"""``python -m kernels_bench front``: its options, tables and files (the benchmark:
``front.bench``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from kernels_bench.front import bench
from kernels_bench.front.bench import KINDS, TARGETS, open_table, plot, run, summarize, table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels_bench front",
                                     description=bench.__doc__.split("\n")[0])
    parser.add_argument("--targets", type=lambda s: s.split(","), default=list(TARGETS),
                        help=f"comma-separated (default: {','.join(TARGETS)})")
    parser.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")],
                        default=[32, 256, 1024])
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["plain", "stream"],
                        help="plain, stream")
    parser.add_argument("--open-rates", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[], metavar="R,...",
                        help="also send plain requests at these fixed rates (requests/s, "
                        "open loop, kernels_bench.front.openloop): the latency a router adds "
                        "at a given load is its p99 minus direct's at the same rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--chunks", type=int, default=8, help="SSE events per streamed answer")
    parser.add_argument("--interval-ms", type=float, default=0.0,
                        help="time between a stream's events at the stand-in engines (0: "
                             "all at once); with many connections, long-lived streams")
    parser.add_argument("--router-core", type=int, default=1)
    parser.add_argument("--load-core", type=int, default=0,
                        help="the stand-in engines and wrk")
    parser.add_argument("--base-src", help="another checkout for hetserve@base:<policy>")
    parser.add_argument("--artifacts", type=Path, default=Path("bench_results/front_artifacts"),
                        help="trained predictors of chimera-trained (made once)")
    parser.add_argument("--out", type=Path, default=Path("docs/research/performance/front.json"))
    args = parser.parse_args(argv)
    for mode in args.modes:
        if mode not in ("plain", "stream"):
            parser.error(f"--modes: unknown {mode!r} (plain, stream)")
    for target in args.targets:
        kind, _, policy = target.partition(":")
        if kind not in KINDS or bool(policy) != (kind not in ("direct", "passthrough")):
            parser.error(f"--targets: unknown {target!r}; give direct, passthrough, or "
                         "<hetserve|hetserve@base|vllm-router|smg>:<policy>")
        workers = policy.partition("/")[2]
        if "/" in policy and not (kind == "hetserve" and workers.isdigit()
                                  and 1 <= int(workers) <= 64):
            parser.error(f"--targets: {target!r}: /N (1 to 64 router workers) is for "
                         "hetserve:<policy>/N")
    if not 0 <= args.interval_ms <= 10_000:
        parser.error("--interval-ms: 0 to 10000")
    if any(not 1 <= r <= 20_000 for r in args.open_rates):
        parser.error("--open-rates: each rate in 1..20000 requests/s")
    if args.repeats < 1 or args.seconds <= 0:
        parser.error("--repeats must be >= 1 and --seconds > 0")
    try:
        cells = run(args)
    except RuntimeError as exc:  # a target that did not start (its log tail is printed)
        sys.exit(f"front: {exc}")
    rows = summarize(cells)
    print()
    print(table([r for r in rows if r["mode"] != "open"]))
    if args.open_rates:
        print()
        print(open_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    shown = {k: v for k, v in vars(args).items() if k != "out"}
    if shown.get("base_src"):  # a checkout of this machine: by its name only
        shown["base_src"] = Path(shown["base_src"]).name
    args.out.write_text(json.dumps({"args": shown,
                                    "cells": [asdict(c) for c in cells], "summary": rows},
                                   indent=1, default=str))
    plot(rows, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
