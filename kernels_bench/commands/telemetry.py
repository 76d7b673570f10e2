"""``python -m kernels_bench telemetry``: its options, tables and file (the benchmark:
``overhead.telemetry``)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from kernels_bench.overhead import telemetry
from kernels_bench.overhead.telemetry import step_overhead, stream


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench telemetry",
                                description=telemetry.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--snapshots", type=int, default=20_000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--waiting", type=int, nargs="+", default=[100, 10_000])
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench_results/telemetry"))
    a = p.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="hetserve-telbench-")
    streams = [stream(ep, n, rate)
               for ep in (f"ipc://{tmp}/stream", "tcp://127.0.0.1:0")
               for n, rate in ((min(a.snapshots, 3000), 1000.0), (a.snapshots, None))]
    print(f"{'transport':10} {'mode':8} {'received':>9} {'snap/s':>9} {'p50 us':>8} {'p99 us':>8}")
    for r in streams:
        print(f"{r['endpoint']:10} {r['mode']:8} {r['received']:>9} {r['per_second']:>9.0f} "
              f"{r['p50_us']:>8.0f} {r['p99_us']:>8.0f}")
    steps = [row for n in a.waiting for row in step_overhead(n, a.steps, a.max_num_seqs)]
    print(f"\n{'waiting':>8} {'telemetry':12} {'step median us':>15} {'x off':>6}")
    for r in steps:
        print(f"{r['waiting']:>8} {r['telemetry']:12} {r['median_us']:>15.1f} "
              f"{r['ratio_vs_off']:>6.2f}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "telemetry.json").write_text(json.dumps({"streams": streams, "steps": steps},
                                                     indent=2))
    print(f"wrote {a.out / 'telemetry.json'}")
