"""``kernels_bench.lab.studies.quality_study``'s pure parts on small synthetic rows: the
similarity-weighted k-NN, which math rows have a template in training, and the
confirmation's protocol; and its workflow signals on the shipped traces (the committed ones)
and the doubt threshold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernels_bench.lab.studies import quality_study as study
from kernels_bench.lab.trace.suites import math_template
from router.trace_format import load_trace

ROOT = Path(__file__).resolve().parents[2]


def rows(problems: list[str], labels: list[list[float]], emb: list[list[float]] | None = None,
         workflows: list[str] | None = None):
    n = len(problems)
    e = np.array(emb if emb is not None else np.eye(n), dtype=np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    return study.Data(np.array(labels, float), np.array(labels) > 0.5, np.array(problems),
                      np.array(workflows or ["solve"] * n), [""] * n, {"minilm": e}, [])


def test_the_weighted_knn_trusts_the_nearest_prompt_of_the_same_workflow() -> None:
    d = rows(["a", "b", "c", "d", "q"],
             [[0, 1], [1, 0], [1, 0], [0, 1], [0, 0]],
             [[1, 0.1, 0], [0.6, 1, 0], [0.5, 1, 0.2], [1, 0, 0], [1, 0.12, 0]],
             ["solve", "solve", "solve", "plan", "solve"])
    tr, te = np.array([0, 1, 2, 3]), np.array([4])
    # d is of another workflow: never a neighbour; unweighted, a's +1 and b's, c's -1
    assert study.knn("minilm", 10)(d, tr, te) == pytest.approx([-1 / 3])
    assert study.knn("minilm", 10, 0.01)(d, tr, te)[0] > 0.99
    assert study.knn("minilm", 1)(d, tr, te) == pytest.approx([1.0])


def test_a_blend_weighs_its_two_candidates_gains() -> None:
    d = rows(["a", "b", "c", "q"], [[0, 1], [1, 0], [0, 1], [0, 0]],
             [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0.1, 0]])
    tr, te = np.array([0, 1, 2]), np.array([3])
    near, base = study.knn("minilm", 1), study.prior  # +1 (a's gain), and 1/3 (the rates')
    assert near(d, tr, te) == pytest.approx([1.0]) and base(d, tr, te) == pytest.approx([1 / 3])
    assert study.blend(0.25, near, base)(d, tr, te) == pytest.approx([0.25 + 0.75 / 3])
    assert study.blend(1.0, near, base)(d, tr, te) == pytest.approx([1.0])


def test_a_math_rows_template_is_seen_only_through_another_folds_problem() -> None:
    ids = [f"gsm_symbolic/0/{i}" for i in (1, 13, 0, 2)]
    assert math_template(ids[0]) == math_template(ids[1])
    assert len({math_template(i) for i in ids}) == 3
    d = rows([*ids, "HumanEval/0"], [[0, 1]] * 5)
    math, seen = study.template_seen(study.template_ids(d), np.array([0, 1, 1, 0, 0]))
    assert math.tolist() == [True, True, True, True, False]
    # 1 and 13 share one across folds; 0 and 2 are the only problems of theirs
    assert seen.tolist() == [True, True, False, False, False]
    math, seen = study.template_seen(study.template_ids(d), np.array([0, 0, 1, 0, 1]))
    assert seen.tolist() == [False, False, False, False, False]


def test_the_confirmation_trains_outside_the_new_problems_and_pairs_its_draws(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    n = 120
    labels = rng.integers(0, 2, (n, 2)).astype(float)
    d = rows([f"gsm_symbolic/0/{i}" for i in range(n)], labels.tolist(),
             rng.normal(size=(n, 4)).tolist())
    new = np.arange(n) >= 60
    seen_rows: list[np.ndarray] = []

    def oracle(d, tr, te):  # knows the new rows' labels: what no real predictor may
        seen_rows.append(tr)
        return d.labels[te, 1] - d.labels[te, 0]

    monkeypatch.setattr(study, "CONFIRM", {"oracle": oracle,
                                           "semantic router (default)": study.prior})
    out = study.confirm(d, new, 200)
    assert out["rows"]["new problems"] == 60 and out["training problems"] == 60
    assert not new[seen_rows[0]].any()
    assert out["predictors"]["oracle"]["new problems"]["apgr"]["value"] == pytest.approx(1.0)
    split = out["rows"]["template seen in training"] + out["rows"]["template not seen"]
    assert split == 60
    diff = out["primary minus default, APGR"]
    assert diff["lo"] > 0 and diff["value"] > 0.5


def test_a_confirmation_file_must_hold_only_new_problems(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"--confirm .*none of --trace's \(it shares 100;"):
        study.run_confirm([study.TRACES[0]], Path(study.TRACES[0]), tmp_path, 10)
    with pytest.raises(SystemExit, match="--confirm: .*absent"):
        study.run_confirm([study.TRACES[0]], tmp_path / "absent.jsonl.gz", tmp_path, 10)
    assert not (tmp_path / "confirm.json").exists()


def test_the_template_ceiling_predicts_a_row_by_the_other_problems_of_its_template() -> None:
    ids = [f"gsm_symbolic/0/{i}" for i in (1, 13, 0, 2)]  # 1 and 13 share a template
    d = rows([*ids, "gsm_symbolic/0/1", "HumanEval/0"],
             [[0, 1], [1, 1], [1, 0], [0, 0], [0, 0], [1, 0]],
             workflows=["solve"] * 4 + ["plan"] * 2)
    rng = np.random.default_rng(0)
    gain = study.template_mean_gain(d, None, rng)
    # 1 and 13: each other's gain; 0 and 2 alone in theirs: the other solve math rows';
    # problem 1 under "plan": no other plan math row; the code row: none
    assert gain.tolist() == pytest.approx([0.0, 1.0, 1 / 3, 0.0, 0.0, 0.0])
    assert study.template_mean_gain(d, 0, rng)[:4].tolist() == pytest.approx(
        [-1 / 3, 0.0, 1 / 3, 0.0])  # m = 0: as if the template had no other problem
    ceiling = study.template_ceiling(d, boot=20, draws=2)
    assert (ceiling["rows"], ceiling["templates"]) == (5, 3)
    assert ceiling["only small right"] == pytest.approx(1 / 5)
    assert [c["others used"] for c in ceiling["by instances"]][:2] == pytest.approx([0.4, 0.4])
    # only 1 and 13 have another problem of their template; 13's nearest is 1, 1's is 2
    d.features["minilm"][:4] = np.pad([[1, 0.1, 0], [1, -0.1, 0], [1, 0.3, 0], [0, 0, 1]],
                                      ((0, 0), (0, 3)))
    assert study.nearest_same_template(d, "minilm") == pytest.approx(0.5)


def test_quality_study_signals_on_the_shipped_traces_are_the_committed_ones() -> None:
    committed = json.loads((ROOT / "docs/research/predictors/quality/study.json").read_text())
    signals = committed["workflow_signals"]
    confidence = json.loads((ROOT / "docs/research/predictors/quality/confidence.json").read_text())
    programs = json.loads((ROOT / "docs/research/predictors/quality/programs.json").read_text())
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
