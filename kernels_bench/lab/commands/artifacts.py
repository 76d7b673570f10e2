"""``python -m kernels_bench artifacts``: its options (the training and its cache:
``lab.replay.artifacts``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kernels_bench.lab.replay import artifacts
from kernels_bench.lab.replay.artifacts import (DATA, MODEL_MAP, OUT, PREDICTORS, build, build_tpot,
                                                fold_dir)
from router.predictors.kinds import kind
from router.predictors.records import Split
from router.train import load_rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench artifacts",
                                description=artifacts.__doc__.split("\n\n")[0])
    p.add_argument("--predictors", nargs="+", default=list(PREDICTORS), choices=PREDICTORS)
    p.add_argument("--data", action="append", help=f"traces (default: {' '.join(DATA)})")
    p.add_argument("--model-map", action="append", metavar="SERVED=TRACE,...",
                   help=f"served model -> trace model (default: {MODEL_MAP})")
    p.add_argument("--out", type=Path, default=OUT, help=f"folder (default: {OUT})")
    p.add_argument("--holdout", type=float,
                   help="share of problems held out for evaluation and the replay "
                        "(default 0.2; not with --folds)")
    p.add_argument("--folds", type=int, metavar="K",
                   help="cross-fit: K artifact sets in OUT/fold-k, fold k holding out the "
                        "problems whose split hash falls in [k/K, (k+1)/K) (2-20)")
    p.add_argument("--seed", type=int, default=0, help="split seed")
    p.add_argument("--profile", type=Path, metavar="CLUSTER",
                   help="also profile this cluster file's engines here and train the TPOT "
                        "heads on the profile's telemetry (OUT/profile, OUT/tpot)")
    p.add_argument("--set", action="append", default=[], metavar="PREDICTOR.KEY=VALUE")
    p.add_argument("--force", action="store_true", help="retrain even when up to date")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    if a.folds is not None and a.holdout is not None:
        p.error("--holdout and --folds: give one (fold k of K holds out 1/K of the problems)")
    if a.folds is not None and not 2 <= a.folds <= 20:
        p.error("--folds must be between 2 and 20")
    holdout = 0.2 if a.holdout is None else a.holdout
    if not 0 < holdout < 1:
        p.error("--holdout must be between 0 and 1 (the replay needs held-out problems)")
    trained = [*a.predictors, *(["tpot"] if a.profile else [])]
    bad = [s for s in a.set if s.partition(".")[0] not in trained]
    if bad:
        p.error(f"--set {bad[0]!r}: expected PREDICTOR.KEY=VALUE for one of "
                f"{', '.join(trained)}")
    t0 = time.perf_counter()
    jobs = ([(a.out, Split(a.seed, holdout))] if a.folds is None else
            [(fold_dir(a.out, k), Split.fold(a.seed, k, a.folds)) for k in range(a.folds)])
    status: dict[str, str] = {}
    data, model_map = a.data or list(DATA), a.model_map or [MODEL_MAP]
    try:
        rows = load_rows(kind(a.predictors[0]), data, model_map)
        for out, split in jobs:
            if a.folds is not None:
                print(f"{out}: problems with split hash in [{split.start:g}, "
                      f"{split.start + split.fraction:g}) held out")
            done = build(a.predictors, data, model_map, out, split, a.set, a.force,
                         not a.quiet, rows)
            status.update({f"{out.name}/{n}": s for n, s in done.items()})
        if a.profile is not None:
            status.update(build_tpot(a.profile, a.out, a.set, a.force, not a.quiet))
    except ValueError as e:
        sys.exit(f"error: {e}")
    changed = [n for n, s in status.items() if s != "up to date"]  # trained or profiled
    print(f"{a.out}: {len(changed)} trained, {len(status) - len(changed)} up to date "
          f"({time.perf_counter() - t0:.0f} s)")
