"""``python -m router.train <predictor> --data ... --out DIR``: train one predictor.

Predictors: semantic_router, length, knn, tpot, capability (``router.predictors.kinds``).
``--data`` (repeatable): a workflow trace, a stage-records file or ``synthetic:N``;
for ``tpot`` telemetry logs or ``synthetic-telemetry:N``. Problems (telemetry blocks)
whose seeded hash falls below ``--holdout`` are left out for ``router.evaluate``.
``--model-map SERVED=TRACE,...`` keeps only the named trace models' records, renamed to the
served models that replay them (the serving replay's engines), so the artifact knows the
cluster's model names. Settings: ``--set key=value`` (repeatable), the fields of the
predictor's settings class, whose defaults are the papers'.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

from router.predictors.kinds import KINDS, Kind, kind, parse_settings, split_rows
from router.predictors.records import Split, fingerprint
from router.predictors.sources import load_records, load_tpot_samples, parse_model_map, serve_as


def load_rows(k: Kind, data: Sequence[str], model_map: Sequence[str] = ()) -> list[Any]:
    """The rows of ``data``; with ``model_map`` (``SERVED=TRACE,...``; not for telemetry),
    only the mapped trace models' records, renamed to the served models."""
    if k.telemetry:
        if model_map:
            raise ValueError("--model-map: telemetry samples already name their engines")
        return load_tpot_samples(data)
    records = load_records(data)
    return serve_as(records, parse_model_map(model_map)) if model_map else records


def data_info(data: Sequence[str], rows: Sequence[Any], split: Split) -> dict[str, Any]:
    """Provenance stored in the artifact (file names only, never a machine's path) and
    its split (``Split.info``)."""
    return {"sources": [Path(d).name for d in data], "records": len(rows),
            "fingerprint": fingerprint(rows), **split.info()}


def train_artifact(k: Kind, rows: Sequence[Any], settings: Any, out: Path,
                   info: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Train ``k`` on the rows its split (``Split.of(info)``) keeps, save the artifact in
    ``out`` with ``info`` (plus the training time); return that info."""
    train, test = split_rows(rows, Split.of(info))
    print(f"{k.name}: {len(rows)} rows, training on {len(train)}, {len(test)} held out")
    if not train:
        raise ValueError(f"{k.name}: the split holds out every row; lower --holdout")
    t0 = time.perf_counter()
    model = k.predictor.train(k.prepare(train), settings, progress=progress)
    info = {**info, "train_seconds": round(time.perf_counter() - t0, 1)}
    model.save(out, info)
    print(f"saved {out} ({info['train_seconds']} s; settings {dataclasses.asdict(settings)})")
    return info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m router.train", description=__doc__.split("\n")[0])
    p.add_argument("predictor", choices=list(KINDS))
    p.add_argument("--data", action="append", required=True)
    p.add_argument("--out", required=True, type=Path, help="artifact folder")
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--model-map", action="append", default=[], metavar="SERVED=TRACE,...",
                   help="train for served models that replay these trace models")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    k = kind(args.predictor)
    try:
        settings = parse_settings(k.settings, args.set)
        rows = load_rows(k, args.data, args.model_map)
        info = data_info(args.data, rows, Split(args.seed, args.holdout))
        if args.model_map:
            info["model_map"] = parse_model_map(args.model_map)
        train_artifact(k, rows, settings, args.out, info, progress=not args.quiet)
    except ValueError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
