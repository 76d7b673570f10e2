"""Per-prompt label tables: one row per prompt, one column per model.

The quality predictors (semantic router, KNN, capability model) learn, for a prompt, every
model's outcome at once; the trace has each model run each problem, so a row gathers the
records of one (problem, workflow, stage) across models. Missing outcomes are NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from router.predictors.features import RequestFeatures, from_record
from router.predictors.records import StageRecord, group


@dataclass(frozen=True)
class PromptTable:
    features: list[RequestFeatures]
    problems: list[str]
    models: list[str]
    correct: np.ndarray
    """(prompts, models) 1.0 / 0.0 / NaN: the (greedy) run's outcome."""
    output_tokens: np.ndarray
    """(prompts, models) this stage's output tokens / NaN."""
    label: np.ndarray
    """(prompts, models) the quality label the predictors learn and the routing metric
    scores (``StageRecord.label``): P(correct) where the source has sampled runs, else
    ``correct``; NaN: unknown."""


def prompt_table(records: Sequence[StageRecord], models: Sequence[str],
                 first_stage_only: bool) -> PromptTable:
    """Rows keyed by (problem, workflow, stage index); ``first_stage_only`` keeps index 0
    (where a workflow's model is chosen)."""
    rows = group((r for r in records if not first_stage_only or r.stage_index == 0),
                 "problem_id", "workflow", "stage_index")
    col = {m: j for j, m in enumerate(models)}
    correct = np.full((len(rows), len(models)), np.nan)
    tokens = np.full((len(rows), len(models)), np.nan)
    label = np.full((len(rows), len(models)), np.nan)
    feats, problems = [], []
    for i, recs in enumerate(rows.values()):
        feats.append(from_record(recs[0]))
        problems.append(recs[0].problem_id)
        for r in recs:
            if r.model in col:
                correct[i, col[r.model]] = float(r.correct)
                label[i, col[r.model]] = r.label
                tokens[i, col[r.model]] = r.output_tokens
    return PromptTable(feats, problems, list(models), correct, tokens, label)


def base_rates(labels: np.ndarray) -> np.ndarray:
    """Per-column mean over the known entries."""
    return np.nanmean(labels, axis=0)
