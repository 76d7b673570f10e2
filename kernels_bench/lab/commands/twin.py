"""``python -m kernels_bench twin``: the serving replay on the digital twin (engine twins
with profiled step times, the real router, a virtual clock). Same options and outputs as
``kernels_bench replay``, plus the twin's; see docs/research/twin.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from kernels_bench.lab.commands.replay import build_parser, check_args, run_replay
from kernels_bench.lab.replay.output import TWIN_ROOT
from kernels_bench.lab.replay.run import ReplayOptions
from kernels_bench.lab.twin.router import DEFAULT_SCRAPE_INTERVAL_S, RouterCosts
from kernels_bench.lab.twin.run import TwinOptions, load_profiles, twin
from kernels_bench.lab.twin.step_time import MAX_SLOWDOWN
from router.config.cluster import ClusterConfig
from router.trace_format import Trace

MAX_OVERHEAD_MS = 60_000.0
SCRAPE_MS_RANGE = (10.0, 60_000.0)
"""``--scrape-interval-ms`` bounds (the router's ``scrape_interval_ms``)."""


def parser() -> argparse.ArgumentParser:
    p = build_parser("python -m kernels_bench twin", __doc__.split("\n\n")[0], live=False)
    g = p.add_argument_group("twin")
    g.add_argument("--profiles", type=Path, required=True, metavar="DIR",
                   help="a profile per engine entry, DIR/<entry>.json (python -m "
                   "kernels_bench profile on the engines, python -m "
                   "kernels_bench.lab.twin.roofline or kernels_bench.lab.twin.floor for a GPU); "
                   "e.g. docs/research/twin/profiles")
    g.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), metavar="N",
                   help="runs simulated at once, a process each (default: 2 or the CPUs)")
    g.add_argument("--jitter", action="store_true",
                   help="step times drawn around the profile's median with its measured "
                   "spread (repeat k: seed k); default: the median")
    g.add_argument("--no-charge-decision", action="store_true",
                   help="do not charge the router's measured time per call to the virtual "
                   "clock (then a run repeats exactly)")
    g.add_argument("--request-overhead-ms", type=float, default=0.0, metavar="MS",
                   help="a fixed cost per call before the engine sees it: HTTP, the engine "
                   "API server (default 0)")
    g.add_argument("--calibration", type=Path, metavar="FILE",
                   help="slowdowns and the per-call overhead fitted by python -m "
                   "kernels_bench.lab.twin.calibrate (on training problems)")
    g.add_argument("--stock", action="store_true",
                   help="engines on vLLM's own schedulers (fcfs, priority) are stock vLLM "
                   "servers: vLLM's unpatched scheduler, no snapshots, the router scrapes "
                   "their /metrics (default: every engine is hetserve's)")
    g.add_argument("--scrape-interval-ms", type=float, default=DEFAULT_SCRAPE_INTERVAL_S * 1e3,
                   metavar="MS", help="with --stock: between two scrapes of a stock "
                   "engine, virtual ms (default 100, the router's)")
    return p


def calibration(path: Path | None, overhead_ms: float) -> tuple[dict[str, float], float]:
    """(slowdown per entry, per-call overhead in ms): the calibration file's, or none and
    ``--request-overhead-ms``; ValueError: a bad file, or both given."""
    if path is None:
        return {}, overhead_ms
    if overhead_ms:
        raise ValueError("give --calibration or --request-overhead-ms, not both")
    try:
        cal = json.loads(path.read_text(encoding="utf-8"))
        slowdown = {str(k): float(v) for k, v in cal["slowdown"].items()}
        overhead = float(cal["request_overhead_ms"])
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"--calibration {path}: not a calibration file ({e})") from None
    if not 0 <= overhead <= MAX_OVERHEAD_MS or not all(0 < k <= MAX_SLOWDOWN
                                                         for k in slowdown.values()):
        raise ValueError(f"--calibration {path}: request_overhead_ms must be in [0, "
                         f"{MAX_OVERHEAD_MS:g}] and every slowdown in (0, {MAX_SLOWDOWN:g}]")
    return slowdown, overhead


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    a = p.parse_args(argv)
    out = check_args(p, a, TWIN_ROOT)
    if a.jobs < 1 or not 0 <= a.request_overhead_ms <= MAX_OVERHEAD_MS:
        p.error(f"--jobs must be >= 1 and --request-overhead-ms in [0, {MAX_OVERHEAD_MS:g}]")
    low, high = SCRAPE_MS_RANGE
    if not low <= a.scrape_interval_ms <= high:
        p.error(f"--scrape-interval-ms must be in [{low:g}, {high:g}]")
    if a.repeats > 1 and a.no_charge_decision and not a.jitter:
        p.error("--repeats > 1 with --no-charge-decision and without --jitter: every repeat "
                "would be the first again, bit for bit; run other --seed values instead "
                "(python -m kernels_bench.lab.twin.queueing and .retention pool their folders)")

    def run(cfg: ClusterConfig, trace: Trace, name: str, opts: ReplayOptions,
            command: str) -> dict[str, Any]:
        if not a.profiles.is_dir():
            raise ValueError(f"--profiles {a.profiles}: not a folder")
        slowdown, overhead_ms = calibration(a.calibration, a.request_overhead_ms)
        unknown = sorted(set(slowdown) - {e.name for e in cfg.engines})
        if unknown:
            raise ValueError(f"--calibration {a.calibration}: engine(s) {', '.join(unknown)} "
                             "are not in the cluster file")
        topts = TwinOptions(load_profiles(a.profiles, [e.name for e in cfg.engines]),
                            RouterCosts(not a.no_charge_decision, overhead_ms / 1e3),
                            slowdown, a.jitter, a.jobs, a.stock, a.scrape_interval_ms / 1e3)
        return twin(cfg, trace, name, opts, topts, command)

    run_replay("twin", argv, a, out, run)
