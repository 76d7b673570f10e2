"""KNN estimator (RouteBalance 4.2) with MiniLM + FAISS on the SYNTHETIC fixture: the
models' quality ranking routes above a random model, mAP above the base rate, output
lengths nearer than each model's mean."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from router.predictors.base import QualityLength
from router.predictors.evaluation import confidence_report, regression_report
from router.predictors.knn import KnnEstimator, KnnSettings
from router.predictors.table import prompt_table
from tests.fixtures.predictors import request, split

MODELS = ["synthetic-large", "synthetic-small"]


@pytest.fixture(scope="module")
def trained() -> KnnEstimator:
    train, _ = split()
    return KnnEstimator.train(prompt_table(train, MODELS, False),
                              KnnSettings(max_length=128), progress=False)


def test_beats_random_and_mean(trained: KnnEstimator) -> None:
    _, test = split()
    table = prompt_table(test, MODELS, False)
    quality, tokens = trained.arrays(table.features)
    report = confidence_report(quality, table.correct, MODELS, 0)
    assert report["macro_map"] > report["macro_base_rate"]
    routing = report["routing"]
    assert routing["top_confidence"] > routing["random_model"]
    known = ~np.isnan(table.output_tokens)
    lengths = regression_report(tokens[known], table.output_tokens[known],
                                list(np.broadcast_to(np.array(MODELS), known.shape)[known]))
    for m in MODELS:
        assert lengths[m]["mae"] < lengths[m]["mae_mean_baseline"]


def test_one_lookup_gives_every_model_and_reloads(trained: KnnEstimator,
                                                  tmp_path: Path) -> None:
    _, test = split()
    reqs = [request(r, str(i)) for i, r in enumerate(test[:8])]
    got = asyncio.run(trained.estimate(reqs))
    assert all(set(row) == set(MODELS) for row in got)
    assert all(isinstance(v, QualityLength) and 0 <= v.quality <= 1 and v.output_tokens > 0
               for row in got for v in row.values())
    trained.save(tmp_path, {"seed": 0, "holdout": 0.2})
    again = KnnEstimator.load(tmp_path)
    for a, b in zip(asyncio.run(again.estimate(reqs)), got):
        for m in MODELS:
            assert a[m].quality == pytest.approx(b[m].quality, abs=1e-5)
            assert a[m].output_tokens == pytest.approx(b[m].output_tokens, rel=1e-5)
