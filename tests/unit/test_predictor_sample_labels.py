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
from tests.replay_fixture import sample_correct, write_trace

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
