"""``python -m kernels_bench predictors``: its options, table and files (the benchmark:
``predictors.latency``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from kernels_bench.predictors import latency
from kernels_bench.predictors.latency import bench, plot, table
from router.predictors.service import ServiceSettings
from router.predictors.sources import load_records, parse_model_map, serve_as


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench predictors",
                                description=latency.__doc__.split("\n")[0])
    p.add_argument("--artifact", action="append", required=True, metavar="NAME=PATH",
                   help="a trained predictor (repeatable), e.g. length=artifacts/length")
    p.add_argument("--data", action="append", required=True,
                   help="records to build requests from (as for router.train)")
    p.add_argument("--model-map", action="append", default=[], metavar="SERVED=TRACE,...",
                   help="as the artifacts were trained with (kernels_bench artifacts)")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--repeats", type=int, default=10, help="batches per size")
    p.add_argument("--workers", type=int, default=1, help="service worker processes")
    p.add_argument("--out", type=Path, default=Path("runs/predictor_bench"))
    args = p.parse_args(argv)
    paths = dict(a.split("=", 1) for a in args.artifact)
    sizes = [int(b) for b in args.batches.split(",")]
    try:
        records = load_records(args.data)
        if args.model_map:
            records = serve_as(records, parse_model_map(args.model_map))
        service = ServiceSettings(max_batch=max(sizes), workers=args.workers)
        results = bench(paths, records, sizes, args.repeats, service)
    except ValueError as e:  # ArtifactError among them
        sys.exit(f"error: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                          "python": platform.python_version()},
              "service": {"max_batch": service.max_batch, "max_wait_ms": service.max_wait_ms,
                          "workers": service.workers},
              "repeats": args.repeats, "results": results}
    (args.out / "predictors.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.out / "predictors.png")
    print(table(results))
    print(f"wrote {args.out / 'predictors.json'} and {args.out / 'predictors.png'}")
