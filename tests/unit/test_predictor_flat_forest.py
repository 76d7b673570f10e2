"""Flat forest (issue 33): fitted trees as arrays, each leaf the quantile of the training
targets reaching it, equal to that computed tree by tree (and to quantile-forest's
per-leaf quantiles where they mean the same); rows on a split threshold go where
scikit-learn sends them. The compiled walk reaches the leaves ``apply`` names and predicts
bit for bit what the first, numpy walk predicted. The length predictor's fast features
equal the scikit-learn transforms (the sketch bit for bit its first form's), its flat
median ranks as well as the forest's, and an artifact from before the flat forest loads
and predicts with the forest."""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quantile_forest import RandomForestQuantileRegressor
from sklearn.ensemble import RandomForestRegressor
from sklearn.feature_extraction.text import TfidfVectorizer

from router.predictors.features import from_record
from router.predictors.flat_forest import FlatForest, leaves
from router.predictors.length import LengthPredictor, LengthSettings, word_analyzer
from router.predictors.metrics import kendall_tau_distance
from tests.fixtures.predictors import split


def reference(trees: list, x: np.ndarray, y: np.ndarray, q: float, rows: np.ndarray
              ) -> np.ndarray:
    """Tree by tree: the leaf each row reaches (``apply``), the ``q`` quantile of the
    training targets in that leaf, the mean over trees."""
    out = np.zeros(len(rows))
    for est in trees:
        train_leaf, leaf = est.apply(x.astype(np.float32)), est.apply(rows.astype(np.float32))
        out += [np.quantile(y[train_leaf == node], q) for node in leaf]
    return out / len(trees)


def numpy_walk(flat: FlatForest, x: np.ndarray) -> np.ndarray:
    """The flat forest's first walk: every (row, tree) pair one level a step, ``depth``
    steps (leaves point at themselves)."""
    x = np.asarray(x, dtype=np.float32)
    rows = x.ravel()
    start = (np.arange(len(x)) * x.shape[1])[:, None]
    node = np.broadcast_to(flat.roots, (len(x), len(flat.roots))).copy()
    for _ in range(flat.depth):
        node = flat.children[2 * node + (rows[start + flat.feature[node]] > flat.threshold[node])]
    return flat.value[node].mean(axis=1)


def data(seed: int, n: int = 300, cols: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, cols))
    return x, np.exp(x[:, 0] + 0.5 * x[:, 1] * x[:, 2] + rng.normal(0, 0.3, n))


@pytest.mark.parametrize(("seed", "q"), [(0, 0.5), (1, 0.1), (2, 0.9)])
def test_equals_the_tree_by_tree_computation(seed: int, q: float) -> None:
    x, y = data(seed)
    forest = RandomForestQuantileRegressor(n_estimators=15, min_samples_leaf=4,
                                           max_features=0.5, random_state=seed).fit(x, y)
    flat = FlatForest.of(forest.estimators_, x, y, q)
    rows = np.vstack([data(seed + 10, 200)[0], x[:50]])  # new rows and training rows
    assert np.allclose(flat.predict(rows), reference(forest.estimators_, x, y, q, rows),
                       rtol=1e-12, atol=1e-12)
    # any fitted scikit-learn trees: a plain random forest, deep trees
    deep = RandomForestRegressor(n_estimators=5, random_state=seed).fit(x, y)
    flat = FlatForest.of(deep.estimators_, x, y, q)
    assert flat.depth == max(e.tree_.max_depth for e in deep.estimators_)
    assert np.allclose(flat.predict(rows), reference(deep.estimators_, x, y, q, rows),
                       rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_walk_reaches_the_leaves_apply_names(seed: int) -> None:
    """Leaf by leaf, ``apply``'s node in every tree (global ids less each tree's root),
    for new rows, training rows and a row on a threshold; predictions bit for bit the
    numpy walk's, whatever the rows' dtype and layout, NaN and infinities too (which
    ``apply`` refuses)."""
    x, y = data(seed)
    forest = RandomForestQuantileRegressor(n_estimators=12, min_samples_leaf=3,
                                           max_features=0.5, random_state=seed).fit(x, y)
    flat = FlatForest.of(forest.estimators_, x, y, 0.5)
    t = forest.estimators_[0].tree_
    edge = np.tile(x[:1], (4, 1))
    edge[0, t.feature[0]] = t.threshold[0]
    edge[1, 0], edge[2, 1], edge[3, 2] = np.nan, np.inf, -np.inf
    rows = np.vstack([data(seed + 20, 100)[0], x[:40], edge])
    finite = rows[:-3].astype(np.float32)
    got = leaves(finite, flat.feature, flat.threshold, flat.children, flat.roots)
    for k, est in enumerate(forest.estimators_):
        assert np.array_equal(got[:, k] - flat.roots[k], est.apply(finite))
    for r in (rows, rows.astype(np.float32), np.asfortranarray(rows), rows[::2], rows[:1]):
        assert np.array_equal(flat.predict(r), numpy_walk(flat, r))
    assert flat.predict(rows[:0]).shape == (0,)


@pytest.mark.parametrize("q", [0.5, 0.25, 0.9])
def test_equals_quantile_forest_per_leaf_quantiles_without_bootstrap(q: float) -> None:
    """quantile-forest's ``aggregate_leaves_first=False`` is the mean over trees of each
    leaf's quantile: the same only where its leaves hold exactly the training rows that
    reach them, i.e. ``bootstrap=False`` (with a bootstrap, its leaves hold the in-bag
    rows, with multiplicity; the flat forest every training row that reaches the leaf)
    and ``max_samples_leaf=None`` (its default, 1, keeps one random row per leaf and then
    ignores ``aggregate_leaves_first``: the quantile over trees of those single rows, which
    is what the length predictor's forest serves for its other quantiles)."""
    x, y = data(3)
    forest = RandomForestQuantileRegressor(n_estimators=15, min_samples_leaf=4,
                                           max_features=0.5, bootstrap=False,
                                           max_samples_leaf=None, random_state=0).fit(x, y)
    flat = FlatForest.of(forest.estimators_, x, y, q)
    rows = data(4, 200)[0]
    assert np.allclose(flat.predict(rows),
                       forest.predict(rows, quantiles=q, aggregate_leaves_first=False),
                       rtol=1e-12, atol=1e-12)


def test_rows_on_a_threshold_go_where_scikit_learn_sends_them() -> None:
    """Integer training columns put every threshold at a midpoint k / 2; test rows exactly on
    them (and a hair either side, below float32 resolution: both cast to float32 as
    scikit-learn does) must reach the leaves ``apply`` names."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 8, size=(400, 3)).astype(np.float64)
    y = rng.normal(size=400) + x[:, 0] * 10 + x[:, 1]
    forest = RandomForestRegressor(n_estimators=8, min_samples_leaf=2, max_features=2,
                                   random_state=0).fit(x, y)
    flat = FlatForest.of(forest.estimators_, x, y, 0.5)
    thresholds = np.unique(np.concatenate(
        [e.tree_.threshold[e.tree_.children_left >= 0] for e in forest.estimators_]))
    assert np.all(2 * thresholds == np.round(2 * thresholds))  # halves: exact in float32
    on = rng.choice(thresholds, size=(300, 3))
    for rows in (on, on + 1e-12, on - 1e-12):
        assert np.array_equal(rows.astype(np.float32), on.astype(np.float32))
        assert np.allclose(flat.predict(rows), reference(forest.estimators_, x, y, 0.5, rows),
                           rtol=1e-12, atol=1e-12)
    # and the other way than ``<`` would send them: exactly on a threshold is left
    est = forest.estimators_[0]
    root_feature, root_threshold = est.tree_.feature[0], est.tree_.threshold[0]
    row = np.full((1, 3), 3.0)
    row[0, root_feature] = root_threshold
    assert est.tree_.children_left[0] in est.decision_path(row.astype(np.float32)).indices


def test_float32_threshold_between_two_doubles() -> None:
    """A threshold that float32 cannot hold (the midpoint of two float32 values): a
    float64 row just above it is still compared as scikit-learn compares it."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(200, 2)).astype(np.float32).astype(np.float64)
    y = x[:, 0] + rng.normal(0, 0.1, 200)
    forest = RandomForestRegressor(n_estimators=4, random_state=0).fit(x, y)
    flat = FlatForest.of(forest.estimators_, x, y, 0.5)
    t = np.concatenate([e.tree_.threshold[e.tree_.children_left >= 0]
                        for e in forest.estimators_])
    f = np.concatenate([e.tree_.feature[e.tree_.children_left >= 0]
                        for e in forest.estimators_])
    rows = np.zeros((len(t), 2))
    rows[np.arange(len(t)), f] = np.nextafter(t, np.inf)  # just right of the threshold
    assert np.array_equal(flat.predict(rows), reference(forest.estimators_, x, y, 0.5, rows))


# ---- the length predictor ----


@pytest.fixture(scope="module")
def length() -> LengthPredictor:
    train, _ = split()
    return LengthPredictor.train(train, LengthSettings(n_estimators=30), progress=False)


def test_fast_one_hot_equals_the_encoder(length: LengthPredictor) -> None:
    train, _ = split()
    rows = [(r.workflow, r.stage, r.model) for r in train[:200]]
    rows += [("never-seen", train[0].stage, train[0].model),       # unseen workflow
             (train[0].workflow, "no-such-stage", "gpt-9"),        # unseen stage, model
             ("x", "y", "z")]                                      # nothing known
    fast = length._onehot(rows)
    assert np.array_equal(fast, length.onehot.transform([list(r) for r in rows]).toarray())
    assert fast[-1].sum() == 0 and fast[-2].sum() == 1


def test_fast_sketch_equals_the_transforms(length: LengthPredictor) -> None:
    train, test = split()
    texts = [r.user_text for r in test[:150]] + [
        "", "   ", "zzqqx wwvvk", "ÜNÏCÖDÉ ÷ 😀",                    # no known n-gram
        "def def def def return return", "THE Answer", "the the the the the the",
        train[0].user_text * 5]                                     # repeats: sublinear tf
    fast = length._sketch(texts)
    slow = length.svd.transform(length.tfidf.transform(texts))
    assert fast.shape == slow.shape
    assert np.allclose(fast, slow, rtol=1e-9, atol=1e-12)
    assert np.array_equal(fast[150:154], np.zeros((4, fast.shape[1])))


def test_sketch_and_median_bit_for_bit_their_first_forms(length: LengthPredictor) -> None:
    """The sketch from the compiled projection equals the numpy product of its first form
    within float64 rounding, and the forest sees the same float32 rows from both; the
    median from the compiled walk equals, bit for bit, the numpy walk, on every held-out
    request (alone and as one batch)."""
    _, test = split()
    vocab, idf, comps = length.tfidf.vocabulary_, length.tfidf.idf_, length.svd.components_

    def first_sketch(text: str) -> np.ndarray:
        grams = Counter(g for g in length._analyze(text) if g in vocab)
        if not grams:
            return np.zeros(comps.shape[0])
        ids = np.fromiter((vocab[g] for g in grams), np.intp, len(grams))
        w = (1 + np.log(np.fromiter(grams.values(), np.float64, len(grams)))) * idf[ids]
        return comps[:, ids] @ (w / np.linalg.norm(w))

    texts = [r.user_text for r in test] + ["", "zzqqx", "the the the"]
    first = np.vstack([first_sketch(t) for t in texts])
    assert np.allclose(length._sketch(texts), first, rtol=1e-12, atol=1e-15)
    x = length._matrix([from_record(r) for r in test], [r.model for r in test])
    a = x.shape[1] - length.settings.stage_index - first.shape[1]
    x_first = x.copy()
    x_first[:, a:a + first.shape[1]] = first[:len(test)]
    assert np.array_equal(x.astype(np.float32), x_first.astype(np.float32))
    assert length.flat is not None
    assert np.array_equal(length.flat.predict(x), numpy_walk(length.flat, x))
    for i in range(0, len(test), 37):
        assert np.array_equal(length.flat.predict(x[i:i + 2]), numpy_walk(length.flat, x[i:i + 2]))
    # predict's straight path: the served quantile of the general one, bit for bit
    feats = [from_record(r) for r in test[:60]]
    general = [{m: q[0] for m, q in row.items()}
               for row in length.quantiles(feats, [length.settings.quantile])]
    assert length.predict(feats) == general
    assert [length.predict([f])[0] for f in feats[:10]] == general[:10]
    assert length.predict([]) == []


def test_feature_rows_are_each_requests_own(length: LengthPredictor) -> None:
    """``_matrix`` computes the text columns once per distinct request: every row is still
    its own request's (requests repeated per model as ``quantiles`` repeats them, shuffled,
    and equal requests as distinct objects)."""
    _, test = split()
    seen: dict[str, object] = {}
    for r in test:
        seen.setdefault(r.user_text, r)
    feats = [from_record(r) for r in list(seen.values())[:6]]
    feats.append(dataclasses.replace(feats[0]))  # equal, another object
    ms = length.model_list
    together = length._matrix([f for f in feats for _ in ms], ms * len(feats))
    alone = np.vstack([length._matrix([f], [m]) for f in feats for m in ms])
    assert np.array_equal(together, alone)
    order = np.random.default_rng(0).permutation(len(feats) * len(ms))
    rows = [f for f in feats for _ in ms]
    models = ms * len(feats)
    shuffled = length._matrix([rows[i] for i in order], [models[i] for i in order])
    assert np.array_equal(shuffled, alone[order])


def test_flat_median_ranks_as_well_as_the_forest(length: LengthPredictor) -> None:
    _, test = split()
    assert length.flat is not None and length.settings.flat_forest
    x = length._matrix([from_record(r) for r in test], [r.model for r in test])
    flat = np.expm1(length.flat.predict(x))
    pooled = np.expm1(np.asarray(length.forest.predict(x, quantiles=[0.5])).ravel())
    truth = np.array([r.remaining_tokens for r in test], dtype=float)
    served = length.predict_own(test, [0.5])[:, 0]
    assert np.allclose(served, flat)  # the served quantile comes from the flat forest
    tau_flat, tau_forest = kendall_tau_distance(flat, truth), kendall_tau_distance(pooled, truth)
    assert abs(tau_flat - tau_forest) <= 0.01
    assert tau_flat < 0.4
    # other quantiles from the forest
    assert np.allclose(length.predict_own(test[:30], [0.9])[:, 0],
                       np.expm1(np.asarray(length.forest.predict(x[:30], quantiles=[0.9]))
                                .ravel()))


def test_legacy_artifact_without_a_flat_forest(length: LengthPredictor,
                                               tmp_path: Path) -> None:
    """model.pkl a 4-tuple and no flat_forest key in the metadata: served by the forest."""
    _, test = split()
    length.save(tmp_path, {"sources": ["synthetic.jsonl.gz"], "seed": 0, "holdout": 0.2})
    with open(tmp_path / "model.pkl", "rb") as f:
        onehot, tfidf, svd, forest, flat = pickle.load(f)
    assert isinstance(flat, FlatForest)
    with open(tmp_path / "model.pkl", "wb") as f:
        pickle.dump((onehot, tfidf, svd, forest), f)
    meta = json.loads((tmp_path / "metadata.json").read_text())
    for part in ("feature_settings", "train_settings"):
        meta[part].pop("flat_forest", None)
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    old = LengthPredictor.load(tmp_path)
    assert old.flat is None and old.settings.flat_forest is False
    x = length._matrix([from_record(r) for r in test[:40]], [r.model for r in test[:40]])
    assert np.allclose(old.predict_own(test[:40], [0.5])[:, 0],
                       np.expm1(np.asarray(forest.predict(x, quantiles=[0.5])).ravel()))
    assert not np.allclose(old.predict_own(test[:40], [0.5]), length.predict_own(test[:40],
                                                                               [0.5]))
    # the current artifact keeps its flat forest
    length.save(tmp_path / "now", {"sources": ["synthetic.jsonl.gz"], "seed": 0,
                                   "holdout": 0.2})
    now = LengthPredictor.load(tmp_path / "now")
    assert now.flat is not None
    assert np.array_equal(now.predict_own(test[:40], [0.5, 0.9]),
                          length.predict_own(test[:40], [0.5, 0.9]))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_fast_analyzer_equals_scikit_learns(text: str) -> None:
    """``word_analyzer`` gives scikit-learn's n-grams, in its order, for any text."""
    tfidf = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    assert word_analyzer(tfidf)(text) == tfidf.build_analyzer()(text)
    other = TfidfVectorizer(ngram_range=(1, 3))  # not the fast form's settings
    assert word_analyzer(other)(text) == other.build_analyzer()(text)
