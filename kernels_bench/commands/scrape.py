"""``python -m kernels_bench scrape``: its options, table and file (the benchmark:
``scrape.bench``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kernels_bench.scrape import bench
from kernels_bench.scrape.bench import BODY, TARGET_PCT, run, table


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench scrape",
                                description=bench.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=_ints, default=[1, 4, 16], metavar="N,...",
                   help="engine counts to measure, comma-separated (default 1,4,16)")
    p.add_argument("--interval-ms", type=float, default=100.0,
                   help="the router's scrape_interval_ms (default 100)")
    p.add_argument("--window-s", type=float, default=5.0,
                   help="seconds of each measured window, scraping on or off (default 5)")
    p.add_argument("--rounds", type=int, default=5,
                   help="on/off pairs per engine count, order alternating (default 5; "
                        "at least 2 for an interval)")
    p.add_argument("--body", type=Path, default=BODY,
                   help="the /metrics body the stand-ins serve (default: a real vLLM "
                        "0.32 body, tests/fixtures/vllm_metrics.txt)")
    p.add_argument("--target-pct", type=float, default=TARGET_PCT,
                   help="the verdict's bound: %% of one core per engine (default 2)")
    p.add_argument("--out", type=Path, default=Path("bench_results/scrape"),
                   help="folder for scrape.json: every window's numbers and the summary "
                        "(default bench_results/scrape)")
    a = p.parse_args(argv)
    if not a.engines or any(not 1 <= n <= 256 for n in a.engines):
        p.error("--engines: each count in 1..256")
    if not 10 <= a.interval_ms <= 60_000:
        p.error("--interval-ms: 10 to 60000 (the router's bounds)")
    if not 0 < a.window_s <= 600 or not 1 <= a.rounds <= 100:
        p.error("--window-s must be in (0, 600] and --rounds in 1..100")
    if not a.body.is_file():
        p.error(f"--body: no file {a.body}")
    result = run(a.engines, a.interval_ms, a.window_s, a.rounds, a.body,
                 target_pct=a.target_pct, progress=lambda line: print(line, flush=True))
    print()
    print(table(result))
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "scrape.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path}")
