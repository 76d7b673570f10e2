"""Quality labels from sampled runs: a trace's samples give each stage record P(correct),
the prompt table's ``label`` carries it to training and to the routing reports, the
capability model fits it as a soft label; data without samples gives the labels,
fingerprints and reports of before."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from router.predictors.capability import CapabilityModel, CapabilitySettings
from router.predictors.evaluation import confidence_report, routing_gain_report
from router.predictors.features import RequestFeatures
from router.predictors.records import fingerprint
from router.predictors.sources import trace_records
from router.predictors.table import PromptTable, prompt_table
from router.trace_format import load_trace
from tests.replay_fixture import sample_correct, write_trace
from tests.scripts import script

ROOT = Path(__file__).resolve().parents[2]
K = 3


def test_trace_samples_become_p_correct_of_every_stage_record(tmp_path: Path) -> None:
    plain = trace_records(write_trace(tmp_path / "plain.jsonl", 4))
    sampled = trace_records(write_trace(tmp_path / "sampled.jsonl", 4, samples=K))
    assert all(r.p_correct is None for r in plain)
    assert len(sampled) == len(plain)  # records come from the greedy runs
    for old, new in zip(plain, sampled):
        assert dataclasses.replace(new, p_correct=None) == old
        problem = int(new.problem_id[1:])
        assert new.p_correct == pytest.approx(
            np.mean([sample_correct(new.model, problem, k) for k in range(K)]))
        assert new.label == new.p_correct
    table = prompt_table(sampled, ["small", "large"], True)
    assert np.isin(table.correct, (0.0, 1.0)).all()  # the greedy outcomes, as before
    assert not np.array_equal(table.label, table.correct)


def test_records_without_samples_keep_their_fingerprint(tmp_path: Path) -> None:
    rows = trace_records(write_trace(tmp_path / "plain.jsonl", 3))
    before = hashlib.sha256()  # the formula before p_correct existed
    for r in rows:
        before.update(json.dumps(dataclasses.astuple(r)[:-1], ensure_ascii=False).encode())
        before.update(b"\n")
    assert fingerprint(rows) == "sha256:" + before.hexdigest()
    assert fingerprint([dataclasses.replace(rows[0], p_correct=0.5)]) != fingerprint(rows[:1])


def test_shipped_traces_label_as_their_greedy_outcomes() -> None:
    rows = [r for t in ("math", "code")
            for r in trace_records(ROOT / f"data/traces/{t}.jsonl.gz")]
    table = prompt_table(rows, sorted({r.model for r in rows}), True)
    assert np.array_equal(table.label, table.correct, equal_nan=True)


def test_the_routing_reports_score_expected_labels_and_keep_binary_metrics() -> None:
    rng = np.random.default_rng(1)
    n = 60
    expected = rng.random((n, 2))
    outcome = (rng.random((n, 2)) < expected).astype(float)
    scores = np.clip(expected + rng.normal(0, 0.2, (n, 2)), 0, 1)
    problems = [f"p{i // 3}" for i in range(n)]
    same = confidence_report(scores, outcome, ["s", "b"], 0, problems)
    assert same == confidence_report(scores, outcome, ["s", "b"], 0, problems, outcome)
    r = confidence_report(scores, outcome, ["s", "b"], 0, problems, expected)
    assert r["macro_map"] == same["macro_map"] and r["ece"] == same["ece"]
    assert r["routing_gain"] == routing_gain_report(scores, expected, ["s", "b"], problems, 0)
    assert r["routing"]["oracle"] == pytest.approx(expected.max(1).mean())


def _features(group: str) -> RequestFeatures:
    text = "Write a python function." if group == "code" else "What is 2 + 3?"
    return RequestFeatures("", text, text, 20, "w", "s", 0)


def test_capability_fits_p_correct_as_a_soft_label() -> None:
    groups = ["code"] * 40 + ["math"] * 40
    p = np.array([[0.2, 0.9] if g == "code" else [0.7, 0.4] for g in groups])
    feats = [_features(g) for g in groups]
    table = PromptTable(feats, [f"p{i}" for i in range(80)], ["a", "b"],
                        (p > 0.5).astype(float), np.zeros_like(p), p)
    model = CapabilityModel.train(table, CapabilitySettings(c=1e4))
    q = model.arrays([_features("code"), _features("math")])
    assert q == pytest.approx(np.array([[0.2, 0.9], [0.7, 0.4]]), abs=0.01)


def test_quality_study_signals_on_the_shipped_traces_are_the_committed_ones() -> None:
    study = script("quality_study")
    committed = json.loads((ROOT / "docs/predictors/quality/study.json").read_text())
    signals = committed["workflow_signals"]
    confidence = json.loads((ROOT / "docs/predictors/quality/confidence.json").read_text())
    programs = json.loads((ROOT / "docs/predictors/quality/programs.json").read_text())
    assert study.workflow_signals(study.TRACES, 1000, ("math",), confidence, programs) == {
        "math": signals["math"]}
    # the noise ceiling of the shipped sampled traces (regenerate study.json when they grow)
    assert study.ceiling(study.SAMPLED, 1000) == committed["ceiling"]
    # code: the examples of the first rows' prompts run again (the whole suite: a minute)
    small, big = (dict(study.parse_model_map([study.MODEL_MAP]))[m]
                  for m in (study.SMALL, study.BIG))
    runs = {(r.problem_id, r.workflow): r
            for r in load_trace(study.TRACES[1]).complete_runs([small, big])}
    keys = sorted(runs)[:9]
    doubt = study.examples_doubt([runs[k].models[small].stages[-1].output_text for k in keys],
                                 [p for p, _ in keys])
    assert doubt.tolist() == signals["code"]["doubt"][:9]


def test_a_continuous_doubt_is_thresholded_on_each_folds_training_problems() -> None:
    study = script("quality_study")
    rng = np.random.default_rng(0)
    problems = [f"p{i}" for i in range(200)]
    doubt = rng.random(200)
    # the small model is right below 0.6, the big one above: the rule's best t is 0.6
    labels = np.stack([doubt < 0.6, doubt >= 0.6], 1).astype(float)
    margin = study.thresholded(doubt, labels, problems)
    assert ((margin > 0) == (doubt > 0.62)).mean() > 0.95
    fold = np.array([study.fold_of(p, 0, study.FOLDS) for p in problems])
    for k in range(study.FOLDS):  # within a fold the margin keeps doubt's order
        mine = fold == k
        assert np.all(np.diff(margin[mine][np.argsort(doubt[mine])]) > 0)
    # a fold's held-out labels choose nothing: change them all and its margins stay
    flipped = labels.copy()
    flipped[fold == 0] = 1 - flipped[fold == 0]
    again = study.thresholded(doubt, flipped, problems)
    assert np.array_equal(again[fold == 0], margin[fold == 0])
