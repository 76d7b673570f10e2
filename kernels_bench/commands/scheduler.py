"""``python -m kernels_bench scheduler``: its options, the benchmark (``overhead.scheduler``), its
files."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from kernels_bench.overhead import scheduler
from kernels_bench.overhead.scheduler import SIZES, plot, print_table, run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench scheduler",
                                description=scheduler.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--steps", type=int, default=300, help="timed schedule() calls per case")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_results/scheduler"))
    a = p.parse_args(argv)
    rows = run(tuple(a.sizes), a.steps, a.max_num_seqs, a.seed)
    print_table(rows)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scheduler.json").write_text(json.dumps(
        {"rows": rows, "cpu_count": os.cpu_count(), "settings": vars(a) | {"out": str(a.out)}},
        indent=2))
    plot(rows, a.out / "scheduler.png")
    print(f"wrote {a.out / 'scheduler.json'} and {a.out / 'scheduler.png'}")
