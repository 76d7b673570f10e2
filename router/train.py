"""``python -m router.train <predictor> --data ... --out DIR``: train one predictor.

Predictors: semantic_router, length, knn, tpot, capability (``router.predictors.kinds``).
``--data`` (repeatable): a workflow trace, a stage-records file or ``synthetic:N``;
for ``tpot`` telemetry logs or ``synthetic-telemetry:N``. Problems (telemetry blocks)
whose seeded hash falls below ``--holdout`` are left out for ``router.evaluate``.
Settings: ``--set key=value`` (repeatable), the fields of the predictor's settings class,
whose defaults are the papers'.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

from router.predictors.kinds import KINDS, Kind, kind, parse_settings, split_rows
from router.predictors.records import fingerprint
from router.predictors.sources import load_records, load_tpot_samples


def load_rows(k: Kind, data: Sequence[str]) -> list[Any]:
    return load_tpot_samples(data) if k.telemetry else load_records(data)


def data_info(data: Sequence[str], rows: Sequence[Any], seed: int, holdout: float
              ) -> dict[str, Any]:
    """Provenance stored in the artifact (file names only, never a machine's path)."""
    return {"sources": [Path(d).name for d in data], "records": len(rows),
            "fingerprint": fingerprint(rows), "seed": seed, "holdout": holdout}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m router.train", description=__doc__.split("\n")[0])
    p.add_argument("predictor", choices=list(KINDS))
    p.add_argument("--data", action="append", required=True)
    p.add_argument("--out", required=True, type=Path, help="artifact folder")
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    k = kind(args.predictor)
    try:
        settings = parse_settings(k.settings, args.set)
        rows = load_rows(k, args.data)
    except ValueError as e:
        p.error(str(e))
    train, test = split_rows(rows, args.seed, args.holdout)
    print(f"{k.name}: {len(rows)} rows, training on {len(train)}, {len(test)} held out")
    t0 = time.perf_counter()
    model = k.predictor.train(k.prepare(train), settings, progress=not args.quiet)
    info = data_info(args.data, rows, args.seed, args.holdout)
    info["train_seconds"] = round(time.perf_counter() - t0, 1)
    model.save(args.out, info)
    print(f"saved {args.out} ({info['train_seconds']} s; settings "
          f"{dataclasses.asdict(settings)})")


if __name__ == "__main__":
    main()
