"""Length predictor (Chimera 3.4) on the SYNTHETIC fixture: beats FCFS and the
input-length proxy on held-out problems; its departures from the paper (stage index, log
target) do what they say; save, reload (also an artifact from before those settings), and
refuse mismatched artifacts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from router.predictors.artifact import ArtifactError
from router.predictors.evaluation import length_report
from router.predictors.features import from_record
from router.predictors.length import LEGACY, LengthPredictor, LengthSettings
from router.predictors.loader import load_predictors
from tests.fixtures.predictors import request, split


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[LengthPredictor, Path]:
    train, _ = split()
    model = LengthPredictor.train(train, LengthSettings(n_estimators=50), progress=False)
    path = tmp_path_factory.mktemp("length")
    model.save(path, {"sources": ["synthetic.jsonl.gz"], "seed": 0, "holdout": 0.2})
    return model, path


def test_beats_fcfs_and_input_length(trained: tuple[LengthPredictor, Path]) -> None:
    model, _ = trained
    _, test = split()
    report = length_report(model.predict_own(test, [0.5, 0.1, 0.9]), test, seed=0)
    for scope in ("all_stages", "first_stages"):
        r = report[scope]
        assert r["kendall_tau_distance"] < 0.4 < r["fcfs"]
        assert r["kendall_tau_distance"] < r["input_length_proxy"] - 0.05


def test_beats_the_papers_feature_set_on_every_stage(
        trained: tuple[LengthPredictor, Path]) -> None:
    model, _ = trained
    train, test = split()
    paper = LengthPredictor.train(train, LengthSettings(n_estimators=50, **LEGACY),
                                  progress=False)
    tau = {name: length_report(m.predict_own(test, [0.5, 0.1, 0.9]), test, seed=0)
           ["all_stages"]["kendall_tau_distance"] for name, m in (("ours", model),
                                                                   ("paper", paper))}
    assert tau["ours"] < tau["paper"] - 0.03


def test_stage_index_is_the_last_column(trained: tuple[LengthPredictor, Path]) -> None:
    model, _ = trained
    _, test = split()
    feats = [from_record(r) for r in test[:10]]
    later = [dataclasses.replace(f, stage_index=f.stage_index + 2) for f in feats]
    models = [r.model for r in test[:10]]
    x, y = model._matrix(feats, models), model._matrix(later, models)
    assert np.array_equal(x[:, -1], [f.stage_index for f in feats])
    assert np.array_equal(y[:, -1] - x[:, -1], np.full(10, 2.0))
    assert np.array_equal(x[:, :-1], y[:, :-1])
    paper = LengthPredictor(model.counter, model.onehot, model.tfidf, model.svd, model.forest,
                            None, model.model_list, LengthSettings(**LEGACY))
    assert paper._matrix(feats, models).shape[1] == x.shape[1] - 1


def test_log_target_answers_in_tokens(trained: tuple[LengthPredictor, Path]) -> None:
    model, _ = trained
    train, test = split()
    x = model._matrix([from_record(r) for r in test[:20]], [r.model for r in test[:20]])
    on_log_scale = model.flat.predict(x)  # the served quantile: the flat forest's
    tokens = model.predict_own(test[:20], [0.5])[:, 0]
    assert np.allclose(tokens, np.expm1(on_log_scale))
    upper = np.asarray(model.forest.predict(x, quantiles=[0.9])).ravel()  # others: the QRF's
    assert np.allclose(model.predict_own(test[:20], [0.9])[:, 0], np.expm1(upper))
    truth = [r.remaining_tokens for r in train]
    assert min(truth) <= tokens.min() and tokens.max() <= max(truth)


def test_quantiles_are_ordered(trained: tuple[LengthPredictor, Path]) -> None:
    model, _ = trained
    _, test = split()
    q = model.predict_own(test[:50], [0.1, 0.5, 0.9])
    assert np.all(q[:, 0] <= q[:, 1]) and np.all(q[:, 1] <= q[:, 2])


def test_reload_gives_same_answers(trained: tuple[LengthPredictor, Path]) -> None:
    model, path = trained
    _, test = split()
    reqs = [request(r, str(i)) for i, r in enumerate(test[:20])]
    again = LengthPredictor.load(path)
    got = asyncio.run(again.remaining_tokens(reqs))
    assert got == asyncio.run(model.remaining_tokens(reqs))
    assert set(got[0]) == {"synthetic-large", "synthetic-small"}
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["kind"] == "length" and meta["models"] == ["synthetic-large", "synthetic-small"]
    assert {"scikit-learn", "quantile-forest", "numpy"} <= set(meta["libraries"])
    assert "/" not in json.dumps(meta["feature_settings"])


def test_artifact_from_before_the_new_settings_loads_as_the_paper(tmp_path: Path) -> None:
    train, test = split(problems=30)
    paper = LengthPredictor.train(train, LengthSettings(n_estimators=10, **LEGACY),
                                  progress=False)
    paper.save(tmp_path, {"sources": ["synthetic.jsonl.gz"], "seed": 0, "holdout": 0.2})
    meta = json.loads((tmp_path / "metadata.json").read_text())
    for part in ("feature_settings", "train_settings"):
        meta[part] = {k: v for k, v in meta[part].items() if k not in LEGACY}
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    old = LengthPredictor.load(tmp_path)
    assert all(getattr(old.settings, k) == v for k, v in LEGACY.items())
    assert np.array_equal(old.predict_own(test, [0.5]), paper.predict_own(test, [0.5]))


def test_mismatched_artifacts_are_refused(trained: tuple[LengthPredictor, Path],
                                          tmp_path: Path) -> None:
    _, path = trained
    models = ["synthetic-large", "synthetic-small"]
    with pytest.raises(ArtifactError, match="also has gpt-9; retrain"):
        load_predictors({"length": str(path)}, [*models, "gpt-9"])
    with pytest.raises(ArtifactError, match="is a 'length' predictor, not 'knn'"):
        load_predictors({"knn": str(path)}, models)
    with pytest.raises(ArtifactError, match="feature setting svd_components = 32, expected 64"):
        load_predictors({"length": str(path)}, models,
                        expected={"length": {"svd_components": 64}})
    with pytest.raises(ArtifactError, match="unknown predictor.*lenght"):
        load_predictors({"lenght": str(path)}, models)
    with pytest.raises(ArtifactError, match="no metadata.json"):
        load_predictors({"length": str(tmp_path)}, models)
    meta = json.loads((path / "metadata.json").read_text())
    meta["libraries"]["scikit-learn"] = "0.1.0"
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="built with scikit-learn 0.1.0"):
        LengthPredictor.load(tmp_path)
    assert load_predictors({"length": str(path)}, models[:1]).length is not None
