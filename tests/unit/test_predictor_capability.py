"""Capability model (LAAR 5.2) on the SYNTHETIC fixture (math and code tasks with
different per-model skill): mAP above the per-model base rate, the simulated skill
structure learned; save and reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from router.predictors.capability import CapabilityModel, CapabilitySettings, coarse
from router.predictors.evaluation import confidence_report
from router.predictors.features import RequestFeatures, from_record
from router.predictors.table import prompt_table
from tests.fixtures.predictors import request, split

MODELS = ["synthetic-large", "synthetic-small"]


def test_beats_base_rate_and_reloads(tmp_path: Path) -> None:
    train, test = split()
    model = CapabilityModel.train(prompt_table(train, MODELS, True), CapabilitySettings())
    table = prompt_table(test, MODELS, True)
    report = confidence_report(model.arrays(table.features), table.correct, MODELS, 0)
    assert report["macro_map"] > report["macro_base_rate"] + 0.05
    assert report["routing"]["top_confidence"] > report["routing"]["random_model"]
    model.save(tmp_path, {"seed": 0, "holdout": 0.2})
    again = CapabilityModel.load(tmp_path)
    reqs = [request(r) for r in test[:10]]
    assert asyncio.run(again.capability(reqs)) == asyncio.run(model.capability(reqs))
    assert np.allclose(again.arrays(table.features), model.arrays(table.features))


def test_learns_the_skill_per_task() -> None:
    """The fixture's small model is better at code than math, the large one the reverse
    (``synthetic.SKILL``); at equal length and language Q(m, x) must say so."""
    model = CapabilityModel.train(prompt_table(split()[0], MODELS, True),
                                  CapabilitySettings())
    math, code = (RequestFeatures("", text, text, 200, "w", "s", 0)
                  for text in ("How many apples are left in total?",
                               "def f(x):\n    return x"))
    (large_m, small_m), (large_c, small_c) = model.arrays([math, code])
    assert small_c > small_m and large_m > large_c


def test_features_are_language_length_task() -> None:
    _, test = split()
    code = next(r for r in test if r.task == "code" and r.stage_index == 0)
    assert coarse(from_record(code), 14) == ["latin", str(int(np.log2(code.prompt_tokens + 1))),
                                             "code"]
