"""Static priors from the trace (``--priors-from-trace``), for policies run on constants.

Per served model, over the trace runs given (the problems the predictor artifacts trained
on when there are artifacts, else every run that every replayed model completed):
  accuracy[m]           = share of its runs whose final answer is correct
  mean_output_tokens[m] = mean output tokens of its stages (as forced in the replay)
They fill, in every ``[router.policies.<name>]`` table that sets ``static_prior = true``,
the tables below that the file leaves out; nothing the file sets is replaced. Without
artifacts these are in-sample constants (the replayed runs are among those averaged): a
weak, explicit prior, not a trained predictor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from router.trace_format import WorkflowRun

FILLS = {
    "chimera": {"confidence": "accuracy", "mean_output_tokens": "mean_output_tokens"},
    "routebalance": {"quality": "accuracy", "mean_output_tokens": "mean_output_tokens"},
    "laar": {"capability": "accuracy", "mean_output_tokens": "mean_output_tokens"},
}
"""Policy -> settings table -> trace statistic that fills it."""


def forced_tokens(run: WorkflowRun, model: str, stage: int) -> int:
    """Output tokens stage ``stage`` generates when ``model`` (a trace model) serves it."""
    return max(1, run.models[model].stages[stage].output_tokens)


def trace_priors(runs: Sequence[WorkflowRun], model_map: Mapping[str, str]
                 ) -> dict[str, dict[str, float]]:
    """``{"accuracy": {served: ...}, "mean_output_tokens": {served: ...}}`` over ``runs``
    (accuracy: P(correct) where the trace has samples, ``WorkflowRun.p_correct``)."""
    acc, length = {}, {}
    for served, traced in model_map.items():
        acc[served] = float(np.mean([r.p_correct(traced) for r in runs]))
        length[served] = float(np.mean([forced_tokens(r, traced, s) for r in runs
                                        for s in range(len(r.roles))]))
    return {"accuracy": acc, "mean_output_tokens": length}


def fill_static_priors(tables: Mapping[str, Mapping[str, Any]],
                       priors: Mapping[str, Mapping[str, float]]
                       ) -> dict[str, dict[str, Any]]:
    """Policy tables with the missing static-prior tables filled (copies)."""
    out = {name: dict(table) for name, table in tables.items()}
    for name, fills in FILLS.items():
        table = out.get(name)
        if table is None or not table.get("static_prior"):
            continue
        for key, stat in fills.items():
            table.setdefault(key, dict(priors[stat]))
    return out
