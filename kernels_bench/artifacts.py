"""``python -m kernels_bench artifacts``: every predictor the replay's policies need, trained
once on the shipped traces and cached.

Trains ``semantic_router`` and ``length`` (Chimera), ``knn`` (RouteBalance) and
``capability`` (LAAR) with ``router.train``'s defaults (the papers') on the training split of
the given traces together (default: math and code), for the served models of the replay
cluster (``--model-map``), and writes ``OUT/<predictor>/``. An artifact is retrained only
when its cache key changes: the fingerprint of the rows it learns from, its settings, the
split and the model map (``--force`` retrains anyway). The replay's ``--artifacts OUT``
routes on them and replays only the problems their split held out.

``--folds K`` (``make artifacts``: 5) cross-fits: ``OUT/fold-k/<predictor>/`` for k < K,
fold k trained on every problem but those whose split hash falls in [k/K, (k+1)/K)
(``records.Split.fold``); the replay then replays every problem of the traces, each
under the fold that never saw it. TPOT heads (RouteBalance)
need an engine's telemetry, not a trace: ``python -m router.train tpot`` (docs/predictors.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from router.predictors.artifact import METADATA_FILE
from router.predictors.kinds import kind, parse_settings
from router.predictors.records import Split
from router.predictors.sources import parse_model_map
from router.train import data_info, load_rows, train_artifact

PREDICTORS = ("semantic_router", "length", "knn", "capability")
DATA = ("data/traces/math.jsonl.gz", "data/traces/code.jsonl.gz")
MODEL_MAP = "tiny-a=qwen2.5-coder-0.5b-instruct,tiny-b=qwen2.5-coder-1.5b-instruct"
"""The replay cluster's engines (examples/replay.toml) and the trace models they replay."""
OUT = Path("artifacts")


def cache_key(name: str, info: dict[str, Any], settings: Any) -> str:
    """sha256 over what an artifact depends on: predictor, rows, split, model map, settings."""
    what = {"predictor": name, "fingerprint": info["fingerprint"], "seed": info["seed"],
            "holdout": info["holdout"], "holdout_start": info["holdout_start"],
            "model_map": info.get("model_map", {}),
            "settings": dataclasses.asdict(settings)}
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def current_key(folder: Path) -> str | None:
    """The cache key of the artifact in ``folder``; None when absent or unreadable."""
    try:
        meta = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
        return str(meta["data"]["cache_key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fold_dir(out: Path, k: int) -> Path:
    """Where fold ``k``'s artifacts go (``--folds``)."""
    return out / f"fold-{k}"


def build(names: Sequence[str], data: Sequence[str], model_map: Sequence[str], out: Path,
          split: Split, sets: Sequence[str], force: bool = False,
          progress: bool = True, rows: Sequence[Any] | None = None) -> dict[str, str]:
    """Train (or keep) every artifact of ``names`` (of ``PREDICTORS``) on the problems
    ``split`` keeps; ``{name: "trained" | "up to date"}``. ``sets``:
    ``predictor.key=value`` settings; ``rows``: ``load_rows`` of ``data`` when already
    loaded (every fold trains on the same rows). ValueError on bad input."""
    status: dict[str, str] = {}
    if rows is None:
        rows = load_rows(kind(names[0]), data, model_map)  # stage records: every kind
    for name in names:
        k = kind(name)
        own = [s.partition(".")[2] for s in sets if s.partition(".")[0] == name]
        settings = parse_settings(k.settings, own)
        info = data_info(data, rows, split)
        if model_map:
            info["model_map"] = parse_model_map(model_map)
        info["cache_key"] = cache_key(name, info, settings)
        folder = out / name
        if not force and current_key(folder) == info["cache_key"]:
            print(f"{name}: up to date ({folder})")
            status[name] = "up to date"
            continue
        train_artifact(k, rows, settings, folder, info, progress)
        status[name] = "trained"
    return status


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench artifacts",
                                description=__doc__.split("\n\n")[0])
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
    bad = [s for s in a.set if s.partition(".")[0] not in a.predictors]
    if bad:
        p.error(f"--set {bad[0]!r}: expected PREDICTOR.KEY=VALUE for one of "
                f"{', '.join(a.predictors)}")
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
    except ValueError as e:
        sys.exit(f"error: {e}")
    trained = [n for n, s in status.items() if s == "trained"]
    print(f"{a.out}: {len(trained)} trained, {len(status) - len(trained)} up to date "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
