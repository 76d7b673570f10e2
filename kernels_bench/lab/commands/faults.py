"""``python -m kernels_bench faults``: its options, table and files (the harness:
``faults.signals``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kernels_bench.lab.faults import signals
from kernels_bench.lab.faults.signals import DEFAULT_CLUSTER, run, table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels_bench faults",
                                     description=signals.__doc__.split("\n")[0])
    parser.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER,
                        help="cluster file (loopback; the first and last engines are the "
                        "victims)")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="load before the first fault and after each recovery")
    parser.add_argument("--request-timeout-s", type=float, default=120.0,
                        help="a client's timeout (then the request counts as lost)")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--max-seconds", type=float, default=1800.0,
                        help="no new fault after this long")
    parser.add_argument("--out", type=Path, default=Path("bench_results/faults.json"))
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= 1024:
        parser.error("--concurrency: 1 to 1024")
    try:
        result = run(args)
    except RuntimeError as exc:
        sys.exit(f"faults: {exc}")
    print()
    print("\n".join(result["launcher_events"]))  # type: ignore[arg-type]
    print()
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")
