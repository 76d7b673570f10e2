"""``python -m kernels_bench replay-vinelm``: its options and files (the replay:
``vinelm.replay``)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from kernels_bench.lab.commands.replay import stop_on_sigterm
from kernels_bench.lab.replay.spec import SpecError
from kernels_bench.lab.vinelm import replay
from kernels_bench.lab.vinelm.replay import VARIANTS, markdown, replay_vinelm
from kernels_bench.lib.cluster import ClusterError
from router.config.cluster import ConfigError


def main(argv: list[str] | None = None) -> None:
    import shlex

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m kernels_bench replay-vinelm",
                                 description=replay.__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", type=Path, required=True, help="replay cluster (TOML)")
    ap.add_argument("--executions", type=Path, required=True,
                    help="recorded executions (python -m kernels_bench vinelm collect)")
    ap.add_argument("--vinelm-config", type=Path, required=True,
                    help="cluster file with the template and prices of the recorded models")
    ap.add_argument("--model-map", action="append", default=[], required=True,
                    metavar="SERVED=RECORDED,...")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--slos", nargs="+", type=float, help="latency SLOs in seconds (default: "
                    "the 25th, 50th and 75th percentile of the trie's leaf latencies)")
    ap.add_argument("--rate", type=float, default=0.5, help="workflows per second (Poisson)")
    ap.add_argument("--workflows", type=int, default=40)
    ap.add_argument("--cascades", type=int, default=1, help="cascades per problem")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="output folder (default: "
                    "bench_results/replay-vinelm/<timestamp>)")
    args = ap.parse_args(argv)
    args.out = args.out or Path("bench_results/replay-vinelm") / time.strftime("%Y%m%d-%H%M%S")
    if (args.out / "summary.json").exists():
        ap.error(f"{args.out} already holds a replay; give another --out")
    args.command = "python -m kernels_bench replay-vinelm " + shlex.join(argv)
    if args.rate <= 0 or args.workflows < 1:
        ap.error("--rate must be > 0 and --workflows >= 1")
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        report = replay_vinelm(args)
    except (ConfigError, SpecError, ClusterError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("\n" + markdown(report))
    print(f"wrote {args.out}")
