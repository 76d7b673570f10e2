"""``python -m kernels_bench fuzz-telemetry``: its options, report and file (the harness:
``faults.telemetry_fuzz``)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from kernels_bench.lab.faults import telemetry_fuzz
from kernels_bench.lab.faults.telemetry_fuzz import print_report, run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench fuzz-telemetry",
                                description=telemetry_fuzz.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=100_000, help="garbage frames (default "
                   "100,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_results/telemetry_fuzz"))
    a = p.parse_args(argv)
    if a.frames < 1:
        p.error("--frames must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    rep = run(a.frames, a.seed)
    print_report(rep)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "telemetry_fuzz.json"
    path.write_text(json.dumps(rep, indent=1))
    print(f"wrote {path}")
    if not rep["ok"]:
        raise SystemExit(1)
