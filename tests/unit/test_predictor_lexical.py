"""The lexical encoder (``knn.encoder = "lexical"``): prompts of one template with other
names' numbers meet, other wording does not; fitted, saved and read back exactly; a file of
another version or a broken one is a one-line ValueError; the KNN trains, routes and
reloads on it (the SYNTHETIC fixture), and a router whose cluster file names it routes
on it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.app import load_configured_predictors
from router.config.cluster import load_cluster_config
from router.dispatch.core import RouterCore
from router.predictors.encoder import load_encoder
from router.predictors.evaluation import confidence_report
from router.predictors.features import from_record
from router.predictors.knn import KnnEstimator, KnnSettings
from router.predictors.lexical import DIMS, FILE, LexicalEncoder, masked
from router.predictors.loader import close_predictors
from router.predictors.table import prompt_table
from tests.fixtures.predictors import request, split

MODELS = ["synthetic-large", "synthetic-small"]
TEMPLATE = "{} has {} apples and buys {} more at {} cents each. How much does {} spend?"
OTHER = "Write a function that returns the {} largest numbers of a list of {} integers."


def test_one_templates_numbers_do_not_matter_and_other_wording_does() -> None:
    texts = [TEMPLATE.format("Janet", 3, 5, 12, "she"),
             TEMPLATE.format("Omar", 17, 2, 1.5, "he"), OTHER.format(3, 40)]
    enc = LexicalEncoder.fit(texts)
    x = enc.embed(texts)
    assert x.shape == (3, DIMS) and x.dtype == np.float32
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-6)
    sim = x @ x.T
    assert sim[0, 1] > 0.6 and sim[0, 2] < 0.1 and sim[1, 2] < 0.1
    assert masked("Pay 1,250.50 now, 3 times") == "pay 0 now, 0 times"


def test_an_empty_or_numberless_text_embeds_as_zeros_and_long_text_is_cut() -> None:
    enc = LexicalEncoder.fit(["some words here", "other words there"], max_length=4)
    x = enc.embed(["", "7 8 9", "some words here " * 10_000])
    assert not x[0].any() and not x[1].any()
    assert np.array_equal(x[2], enc.embed(["some words here " * 4])[0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=300), min_size=1, max_size=6))
def test_any_text_embeds_finite_and_at_most_unit_length(texts: list[str]) -> None:
    x = LexicalEncoder.fit(texts).embed(texts)
    assert x.shape == (len(texts), DIMS) and np.isfinite(x).all()
    assert (np.linalg.norm(x, axis=1) <= 1 + 1e-5).all()


def test_saved_and_read_back_exactly(tmp_path: Path) -> None:
    texts = [TEMPLATE.format("Ann", 1, 2, 3, "she"), OTHER.format(2, 9)]
    enc = LexicalEncoder.fit(texts)
    enc.save(tmp_path)
    again = load_encoder(tmp_path, max_length=32)
    assert isinstance(again, LexicalEncoder) and again.max_length == 32
    assert np.array_equal(again.embed(texts), LexicalEncoder(enc.idf, 32).embed(texts))


@pytest.mark.parametrize("body, says", [
    ("{", "unreadable"), ('{"dims": 4096}', "unreadable"),
    (json.dumps({"dims": 1024, "ngrams": [1, 2], "idf": [1.0] * 1024}), "1024 dimensions"),
    (json.dumps({"dims": DIMS, "ngrams": [1, 2], "idf": [1.0] * 3}), "finite"),
    (json.dumps({"dims": DIMS, "ngrams": [1, 2], "idf": [1.0] * (DIMS - 1) + [float("nan")]}),
     "finite")])
def test_a_broken_or_foreign_file_is_one_value_error(tmp_path: Path, body: str,
                                                     says: str) -> None:
    (tmp_path / FILE).write_text(body)
    with pytest.raises(ValueError, match=says):
        LexicalEncoder.load(tmp_path)


def test_the_knn_trains_routes_and_reloads_on_it(tmp_path: Path) -> None:
    train, test = split()
    est = KnnEstimator.train(prompt_table(train, MODELS, False),
                             KnnSettings(encoder="lexical", k=20, temperature=0.1),
                             progress=False)
    table = prompt_table(test, MODELS, False)
    quality, _ = est.arrays(table.features)
    routing = confidence_report(quality, table.correct, MODELS, 0)["routing"]
    assert routing["top_confidence"] > routing["random_model"]
    est.save(tmp_path, {"seed": 0})
    again = KnnEstimator.load(tmp_path)
    assert isinstance(again.encoder, LexicalEncoder)
    reqs = [request(r, str(i)) for i, r in enumerate(test[:8])]
    for a, b in zip(asyncio.run(again.estimate(reqs)), asyncio.run(est.estimate(reqs))):
        for m in MODELS:
            assert a[m].quality == pytest.approx(b[m].quality, abs=1e-6)


def test_a_cluster_file_naming_a_lexical_knn_routes_on_it(tmp_path: Path) -> None:
    """The router's own loading path (``load_configured_predictors``): RouteBalance's
    estimates through the router equal the artifact's, loaded here."""
    train, test = split(problems=8)
    est = KnnEstimator.train(prompt_table(train, MODELS, False),
                             KnnSettings(encoder="lexical", k=5), progress=False)
    est.save(tmp_path / "art" / "knn", {"seed": 0})
    lines = ['[router]\npolicy = "routebalance"\n', "[router.predictors]", 'knn = "art/knn"\n',
             "[router.policies.routebalance]", "static_prior = true",
             "decode_ms_per_token = { " + ", ".join(f'"{m}" = 5.0' for m in MODELS) + " }",
             "cost_per_token = { " + ", ".join(f'"{m}" = 0.0' for m in MODELS) + " }\n"]
    for i, m in enumerate(MODELS):
        lines += ["[[engines]]", f'name = "{m}"', 'model = "builtin:tiny-a"',
                  f'served_model_name = "{m}"', f"port = {18700 + i}",
                  f'telemetry_endpoint = "ipc://{tmp_path}/{m}.telemetry"',
                  f'kv_events_endpoint = "ipc://{tmp_path}/{m}.kv"\n']
    (tmp_path / "cluster.toml").write_text("\n".join(lines))
    cfg = load_cluster_config(tmp_path / "cluster.toml")
    pset = load_configured_predictors(cfg)
    assert pset is not None
    try:
        policy = RouterCore(cfg, pset).build_policy()
        reqs = [request(r, str(i)) for i, r in enumerate(test[:8])]
        got = asyncio.run(policy.predict(reqs))
        assert list(got) == KnnEstimator.load(tmp_path / "art" / "knn").predict(
            [from_record(r) for r in test[:8]])
    finally:
        close_predictors(pset)
