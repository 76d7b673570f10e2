"""scripts/quality_study.py's pure parts on small synthetic rows: the similarity-weighted
k-NN, which math rows have a template in training, and the confirmation's protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels_bench.trace.suites import math_template
from tests.scripts import script


def rows(problems: list[str], labels: list[list[float]], emb: list[list[float]] | None = None,
         workflows: list[str] | None = None):
    study = script("quality_study")
    n = len(problems)
    e = np.array(emb if emb is not None else np.eye(n), dtype=np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    return study.Data(np.array(labels, float), np.array(labels) > 0.5, np.array(problems),
                      np.array(workflows or ["solve"] * n), [""] * n, {"minilm": e}, [])


def test_the_weighted_knn_trusts_the_nearest_prompt_of_the_same_workflow() -> None:
    study = script("quality_study")
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
    study = script("quality_study")
    d = rows(["a", "b", "c", "q"], [[0, 1], [1, 0], [0, 1], [0, 0]],
             [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0.1, 0]])
    tr, te = np.array([0, 1, 2]), np.array([3])
    near, base = study.knn("minilm", 1), study.prior  # +1 (a's gain), and 1/3 (the rates')
    assert near(d, tr, te) == pytest.approx([1.0]) and base(d, tr, te) == pytest.approx([1 / 3])
    assert study.blend(0.25, near, base)(d, tr, te) == pytest.approx([0.25 + 0.75 / 3])
    assert study.blend(1.0, near, base)(d, tr, te) == pytest.approx([1.0])


def test_a_math_rows_template_is_seen_only_through_another_folds_problem() -> None:
    study = script("quality_study")
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
    study = script("quality_study")
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
    study = script("quality_study")
    with pytest.raises(SystemExit, match=r"--confirm .*none of --trace's \(it shares 100;"):
        study.run_confirm([study.TRACES[0]], Path(study.TRACES[0]), tmp_path, 10)
    with pytest.raises(SystemExit, match="--confirm: .*absent"):
        study.run_confirm([study.TRACES[0]], tmp_path / "absent.jsonl.gz", tmp_path, 10)
    assert not (tmp_path / "confirm.json").exists()


def test_the_template_ceiling_predicts_a_row_by_the_other_problems_of_its_template() -> None:
    study = script("quality_study")
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
