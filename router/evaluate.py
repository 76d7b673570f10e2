"""``python -m router.evaluate <predictor> --data ... --artifact DIR``: held-out evaluation.

Evaluates on the problems (telemetry blocks) the artifact's training split held out
(``--all``: on every row, for data the artifact never saw), against each predictor's
naive baseline (``router.predictors.evaluation``). Writes a JSON report and a PNG plot
(reliability diagram for confidences, predicted vs true for lengths and TPOT).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from router.predictors.evaluation import PAPERS
from router.predictors.kinds import KINDS, kind, split_rows
from router.predictors.plots import save_figure
from router.predictors.records import Split, fingerprint
from router.train import load_rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m router.evaluate",
                                description=__doc__.split("\n")[0])
    p.add_argument("predictor", choices=list(KINDS))
    p.add_argument("--data", action="append", required=True)
    p.add_argument("--artifact", required=True, type=Path)
    p.add_argument("--all", action="store_true", help="evaluate on every row")
    p.add_argument("--model-map", action="append", default=[], metavar="SERVED=TRACE,...",
                   help="as given to router.train (default: the artifact's)")
    p.add_argument("--report", type=Path, help="JSON (default: ARTIFACT/evaluation.json)")
    p.add_argument("--plot", type=Path, help="PNG (default: ARTIFACT/evaluation.png)")
    args = p.parse_args(argv)
    k = kind(args.predictor)
    try:
        model = k.predictor.load(args.artifact)
        given = args.model_map or [f"{a}={b}" for a, b in
                                   model.meta.data.get("model_map", {}).items()]
        rows = load_rows(k, args.data, given)
    except ValueError as e:
        p.error(str(e))
    trained = model.meta.data
    test = rows if args.all else split_rows(rows, Split.of(trained))[1]
    if not test:
        p.error("no held-out rows in this data (use --all for data the artifact never saw)")
    print(f"{k.name}: evaluating on {len(test)} of {len(rows)} rows")
    report, panels = k.evaluate(model, k.prepare(test), trained["seed"])
    sources = [Path(d).name for d in args.data]
    meta = model.meta
    out: dict[str, Any] = {
        "predictor": k.name,
        "artifact": {"models": meta.models, "engines": meta.engines,
                     "feature_settings": meta.feature_settings,
                     "train_settings": meta.train_settings, "data": trained},
        "evaluation_data": {"sources": sources, "rows": len(rows), "evaluated": len(test),
                            "split": "all rows" if args.all else "held-out split",
                            "same_data_as_training": fingerprint(rows) == trained["fingerprint"]},
        "metrics": report, "papers": PAPERS.get(k.name, {})}
    report_path = args.report or args.artifact / "evaluation.json"
    plot_path = args.plot or args.artifact / "evaluation.png"
    report_path.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    save_figure(panels, plot_path, f"{k.name} on {', '.join(sources)} ({len(test)} rows)")
    print(json.dumps(_headline(report), indent=2))
    print(f"wrote {report_path} and {plot_path}")


def _headline(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its per-bin reliability tables (the JSON keeps them)."""
    return {k: _headline(v) if isinstance(v, dict) else v for k, v in report.items()
            if k != "reliability"}


if __name__ == "__main__":
    main()
