"""Choose the static semantic router's training settings on validation splits inside the
training problems only (docs/research/predictors.md, "Encoders").

    python -m kernels_bench.lab.studies.select_semantic [--seeds 1 2 3] [--out FILE]

The problems the default split (seed 0, 20 %) holds out are removed first and never seen;
the rest is split again (``Split(seed, 0.25)`` for each ``--seeds``), each grid point trained
on three quarters and scored on the last: macro mAP, AUC and APGR (router.predictors
.evaluation). Prints one line per grid point (means over seeds) and writes JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from router.predictors.evaluation import confidence_report
from router.predictors.kinds import split_rows
from router.predictors.records import Split, models_of
from router.predictors.semantic import SemanticRouter, SemanticSettings
from router.predictors.sources import load_records, parse_model_map, serve_as
from router.predictors.table import prompt_table

TRACES = ["data/traces/math.jsonl.gz", "data/traces/code.jsonl.gz"]
MODEL_MAP = "tiny-a=qwen2.5-coder-0.5b-instruct,tiny-b=qwen2.5-coder-1.5b-instruct"
GRID = {"static_lr": [3e-4, 1e-3, 3e-3, 1e-2], "static_epochs": [5, 10, 20]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", type=Path, default=Path("docs/research/predictors/select-semantic.json"))
    args = p.parse_args()
    records = serve_as(load_records(TRACES), parse_model_map([MODEL_MAP]))
    models = models_of(records)
    inside, _ = split_rows(records, Split(0, 0.2))
    rows = []
    for values in itertools.product(*GRID.values()):
        settings = SemanticSettings(**dict(zip(GRID, values)))
        scores = []
        for seed in args.seeds:
            train, val = split_rows(inside, Split(seed, 0.25))
            table = prompt_table(val, models, True)
            router = SemanticRouter.train(prompt_table(train, models, True), settings,
                                          progress=False)
            q = np.array([[row[m] for m in models] for row in router.predict(table.features)])
            r = confidence_report(q, table.correct, models, seed, table.problems, table.label)
            scores.append((r["macro_map"], r["macro_auc"], r["routing_gain"]["apgr"]["value"]))
        mean = np.mean(scores, axis=0)
        rows.append({**dict(zip(GRID, values)), "map": mean[0], "auc": mean[1],
                     "apgr": mean[2], "per_seed": scores})
        print(" ".join(f"{k}={v}" for k, v in zip(GRID, values)),
              f"mAP {mean[0]:.3f} AUC {mean[1]:.3f} APGR {mean[2]:.3f}", flush=True)
    best = max(rows, key=lambda r: r["map"])
    print("best by validation mAP:", {k: best[k] for k in GRID})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seeds": args.seeds, "grid": rows, "best": best}, indent=1))


if __name__ == "__main__":
    main()
