"""The five predictors by name: how each is trained, loaded and evaluated.

Names are the keys of cluster.toml's ``[router.predictors]`` table and the first argument
of ``python -m router.train`` / ``python -m router.evaluate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, get_type_hints

import numpy as np

from router.predictors.base import TpotQuery
from router.predictors.capability import CapabilityModel, CapabilitySettings
from router.predictors.evaluation import confidence_report, length_report, regression_report
from router.predictors.knn import KnnEstimator, KnnSettings
from router.predictors.length import LengthPredictor, LengthSettings
from router.predictors.records import Split, StageRecord, models_of
from router.predictors.semantic import SemanticRouter, SemanticSettings
from router.predictors.table import PromptTable, prompt_table
from router.predictors.tpot import TpotHeads, TpotSample, TpotSettings

Panels = list[tuple[str, Any]]


@dataclass(frozen=True)
class Kind:
    name: str
    predictor: Any
    """The class: ``train(data, settings, progress)``, ``save``, ``load``."""
    settings: type
    telemetry: bool
    """Trains on telemetry logs (else on stage records)."""
    prepare: Callable[[Sequence[Any]], Any]
    """Training / evaluation rows -> the predictor's input."""
    evaluate: Callable[[Any, Any, int], tuple[dict[str, Any], Panels]]
    """(predictor, prepared held-out data, seed) -> (report, plot panels)."""


def _matrix(rows: Sequence[Mapping[str, float]], models: Sequence[str]) -> np.ndarray:
    return np.array([[row[m] for m in models] for row in rows])


def _routing_panel(report: dict[str, Any], name: str) -> Panels:
    """The score-against-share panel, when the report has a routing gain."""
    gain = report.get("routing_gain")
    return [("routing", (gain, f"{name}: as a router"))] if gain else []


def _eval_confidences(name: str) -> Callable[[Any, PromptTable, int],
                                             tuple[dict[str, Any], Panels]]:
    def run(pred: Any, table: PromptTable, seed: int) -> tuple[dict[str, Any], Panels]:
        scores = _matrix(pred.predict(table.features), table.models)
        report = confidence_report(scores, table.correct, table.models, seed,
                                   table.problems, table.label)
        return report, [("reliability", (report["reliability"], f"{name}: reliability")),
                        *_routing_panel(report, name)]
    return run


def _eval_length(pred: LengthPredictor, records: Sequence[StageRecord], seed: int
                 ) -> tuple[dict[str, Any], Panels]:
    q = pred.predict_own(records, [0.5, 0.1, 0.9])
    truth = np.array([r.remaining_tokens for r in records], dtype=float)
    return length_report(q, records, seed), [
        ("scatter", (q[:, 0], truth, "length: median remaining workflow tokens",
                     "remaining tokens"))]


def _eval_knn(pred: KnnEstimator, table: PromptTable, seed: int
              ) -> tuple[dict[str, Any], Panels]:
    quality, tokens = pred.arrays(table.features)
    known = ~np.isnan(table.output_tokens)
    models = np.broadcast_to(np.array(table.models), known.shape)
    report = {"quality": confidence_report(quality, table.correct, table.models, seed,
                                           table.problems, table.label),
              "output_tokens": regression_report(tokens[known], table.output_tokens[known],
                                                 list(models[known]))}
    return report, [
        ("reliability", (report["quality"]["reliability"], "knn: quality reliability")),
        *_routing_panel(report["quality"], "knn"),
        ("scatter", (tokens[known], table.output_tokens[known], "knn: output tokens",
                     "output tokens"))]


def _eval_tpot(pred: TpotHeads, rows: Sequence[TpotSample], seed: int
               ) -> tuple[dict[str, Any], Panels]:
    known = [r for r in rows if r.engine in pred.engines]
    est = np.array(pred.tpot_ms([TpotQuery(r.engine, r.batch_size, r.pending_decode_tokens,
                                           r.context_tokens, r.kv_usage) for r in known]))
    truth = np.array([r.tpot_ms for r in known])
    return ({"per_engine": regression_report(est, truth, [r.engine for r in known])},
            [("scatter", (est, truth, "tpot heads: time per output token", "ms"))])


def _prompts(first_stage_only: bool) -> Callable[[Sequence[StageRecord]], PromptTable]:
    return lambda records: prompt_table(records, models_of(records), first_stage_only)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("semantic_router", SemanticRouter, SemanticSettings, False, _prompts(True),
         _eval_confidences("semantic router")),
    Kind("length", LengthPredictor, LengthSettings, False, list, _eval_length),
    Kind("knn", KnnEstimator, KnnSettings, False, _prompts(False), _eval_knn),
    Kind("tpot", TpotHeads, TpotSettings, True, list, _eval_tpot),
    Kind("capability", CapabilityModel, CapabilitySettings, False, _prompts(True),
         _eval_confidences("capability model")),
)}


def kind(name: str) -> Kind:
    if name not in KINDS:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def row_key(row: Any) -> str:
    """What the held-out split hashes: a record's problem, or a block of consecutive
    telemetry samples of an engine (neighbouring samples are near-duplicates)."""
    return row.problem_id if isinstance(row, StageRecord) else f"{row.engine}:{row.block}"


def split_rows(rows: Sequence[Any], split: Split) -> tuple[list[Any], list[Any]]:
    """(training rows, held-out rows) of ``split``."""
    train: list[Any] = []
    test: list[Any] = []
    for row in rows:
        (test if split.holds_out(row_key(row)) else train).append(row)
    return train, test


def parse_settings(cls: type, pairs: Sequence[str]) -> Any:
    """A settings dataclass from ``key=value`` strings, typed by its fields."""
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in names:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(names)}")
        tp = hints[key]
        try:
            kwargs[key] = value.lower() in ("1", "true", "yes") if tp is bool else tp(value)
        except ValueError:
            raise ValueError(f"--set {pair!r}: {key} must be {tp.__name__}") from None
    return cls(**kwargs)
