"""Static encoder (issue 33): MiniLM distilled into a model2vec table (once per module:
60-130 s on two shared cores) embeds as the normalised mean of a prompt's first
``max_length`` token vectors, round-trips through its folder without a machine path,
is what ``build_encoder`` / ``load_encoder`` pick for it, and serves the semantic router
(its table fine-tuned under the head) and the KNN estimator on the SYNTHETIC fixture."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from router.predictors.encoder import (MINILM, MINILM_STATIC, STATIC_DIMS, Encoder,
                                       StaticEncoder, TokenCounter, build_encoder,
                                       load_encoder, load_tokenizer, resolve_encoder)
from router.predictors.evaluation import confidence_report
from router.predictors.knn import KnnEstimator, KnnSettings
from router.predictors.semantic import SemanticRouter, SemanticSettings
from router.predictors.table import prompt_table
from tests.fixtures.predictors import check_fixture_skill, records, request, split

MODELS = ["synthetic-large", "synthetic-small"]
WORDS = ["apple", "river", "stone", "cloud", "green", "music", "paper", "table"]
"""Each one token of MiniLM's vocabulary (checked in ``test_long_text_...``)."""


@pytest.fixture(scope="module")
def static() -> StaticEncoder:
    enc = build_encoder(MINILM_STATIC)
    assert isinstance(enc, StaticEncoder)
    return enc


@pytest.fixture(scope="module")
def saved(static: StaticEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("static") / "encoder"
    static.save(path)
    return path


def direct(enc: StaticEncoder, ids: list[int]) -> np.ndarray:
    """The embedding computed from the table itself."""
    v = enc.vectors[ids].astype(np.float64).mean(axis=0)
    return v / np.linalg.norm(v)


def test_unit_rows_of_the_static_width(static: StaticEncoder) -> None:
    texts = [r.user_text for r in records()[:50]] + ["x", "Hello, world!"]
    emb = static.embed(texts, batch_size=16)
    assert emb.shape == (len(texts), STATIC_DIMS) == (len(texts), static.dim)
    assert emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    # batching changes nothing; model2vec's own encode agrees (it averages in float16)
    assert np.array_equal(static.embed(texts, batch_size=5), emb)
    assert np.allclose(static.model.encode(texts), emb, atol=2e-3)
    assert static.embed([]).shape == (0, STATIC_DIMS)


def test_a_text_without_tokens_is_a_zero_row(static: StaticEncoder) -> None:
    emb = static.embed(["", "   \n\t", "apple"])
    assert not np.isnan(emb).any()
    assert np.array_equal(emb[:2], np.zeros((2, STATIC_DIMS)))
    assert np.linalg.norm(emb[2]) == pytest.approx(1.0, abs=1e-5)


def test_long_text_embeds_as_its_first_max_length_tokens(static: StaticEncoder) -> None:
    ids = [static.tokenizer.tokenizer.encode(w, add_special_tokens=False).ids for w in WORDS]
    assert all(len(i) == 1 for i in ids)
    rng = np.random.default_rng(0)
    seq = rng.integers(0, len(WORDS), 3000)
    long = " ".join(WORDS[i] for i in seq)
    first = " ".join(WORDS[i] for i in seq[:static.max_length])
    emb = static.embed([long, first])
    assert np.array_equal(emb[0], emb[1])
    assert np.allclose(emb[0], direct(static, [ids[i][0] for i in seq[:static.max_length]]),
                       atol=1e-5)
    short = StaticEncoder(static.model, max_length=10)
    assert np.allclose(short.embed([long])[0],
                       direct(static, [ids[i][0] for i in seq[:10]]), atol=1e-5)
    # The text is cut at max_length x CHARS_PER_TOKEN characters before tokenizing: where
    # tokens are sparser than that (long runs of whitespace) the embedding is that of the
    # cut text (its last word possibly split), fewer than max_length tokens (about half of
    # 256), not the first max_length tokens of the whole text.
    spaced = (" " * 30).join(WORDS[i] for i in seq)
    cut = spaced[:static.max_length * StaticEncoder.CHARS_PER_TOKEN]
    kept = static.tokenizer.tokenizer.encode(cut, add_special_tokens=False).ids
    assert len(kept) < static.max_length
    assert np.array_equal(static.embed([spaced])[0], static.embed([cut])[0])
    assert np.allclose(static.embed([spaced])[0], direct(static, kept), atol=1e-5)


def test_max_length_above_512_is_honoured(static: StaticEncoder) -> None:
    rng = np.random.default_rng(1)
    seq = rng.integers(0, len(WORDS), 2000)
    ids = [static.tokenizer.tokenizer.encode(w, add_special_tokens=False).ids[0] for w in WORDS]
    wide = StaticEncoder(static.model, max_length=1000)
    assert np.allclose(wide.embed([" ".join(WORDS[i] for i in seq)])[0],
                       direct(static, [ids[i] for i in seq[:1000]]), atol=1e-5)


def test_save_load_round_trip_without_a_machine_path(static: StaticEncoder,
                                                     saved: Path) -> None:
    again = load_encoder(saved)
    assert isinstance(again, StaticEncoder) and again.dim == STATIC_DIMS
    texts = [r.user_text for r in records()[:40]] + ["", "apple river"]
    assert np.array_equal(again.embed(texts), static.embed(texts))
    config = json.loads((saved / "config.json").read_text())
    assert config["model_type"] == "model2vec"
    assert not any(isinstance(v, str) and ("/" in v or "\\" in v) for v in config.values())
    source = str(resolve_encoder(MINILM))
    for f in saved.iterdir():  # nor anywhere else in the folder
        if f.suffix in (".json", ".md", ".txt"):
            assert source not in f.read_text(), f.name


def test_build_and_load_pick_the_kind(static: StaticEncoder, saved: Path) -> None:
    # one distillation per source and process
    assert StaticEncoder.distill(resolve_encoder(MINILM)).model is static.model
    assert isinstance(build_encoder(str(saved), max_length=32), StaticEncoder)
    assert build_encoder(str(saved), max_length=32).max_length == 32
    assert load_encoder(saved, max_length=16).max_length == 16
    transformer = resolve_encoder(MINILM)
    assert isinstance(build_encoder(MINILM), Encoder)
    assert isinstance(load_encoder(transformer), Encoder)
    assert isinstance(build_encoder(str(transformer)), Encoder)
    with pytest.raises(ValueError, match="not a local Hugging Face model folder"):
        build_encoder(str(saved.parent))


def test_token_counter_counts_every_token() -> None:
    tok = load_tokenizer(resolve_encoder(MINILM))
    counter = TokenCounter(tok)
    texts = ["", "a", "apple river stone", "word " * 300]
    assert counter.counts(texts) == [0, 1, 3, 300]
    assert counter("word " * 300) == 300


def test_semantic_router_with_the_static_encoder(static: StaticEncoder,
                                                 tmp_path: Path) -> None:
    """As the fine-tuned MiniLM's test (test_predictor_semantic.py): trained on 20 problems
    per task, beats the base rate on every held-out problem of the seeded split."""
    train, test = split(problems=20)[0], split()[1]
    settings = SemanticSettings(max_length=64)
    assert settings.encoder == MINILM_STATIC
    before = static.model.embedding.copy()
    model = SemanticRouter.train(prompt_table(train, MODELS, True), settings, progress=False)
    assert isinstance(model.encoder, StaticEncoder) and model.encoder.max_length == 64
    # the table was tuned in a copy: the distilled one (shared in the process) is intact
    assert not np.allclose(model.encoder.vectors, static.vectors, atol=1e-4)
    assert np.array_equal(static.model.embedding, before)
    assert StaticEncoder.distill(resolve_encoder(MINILM)).model is static.model
    # served as trained (the training scale folded into the head): it fits its rows
    fitted = prompt_table(train, MODELS, True)
    scores = np.array([[row[m] for m in MODELS] for row in model.predict(fitted.features)])
    for v in confidence_report(scores, fitted.correct, MODELS, 0)["per_model"].values():
        assert v["brier"] < v["brier_base_rate"] - 0.05
    check_fixture_skill(model, test, MODELS)
    model.save(tmp_path, {"seed": 0, "holdout": 0.2})
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["feature_settings"]["encoder"] == MINILM_STATIC
    again = SemanticRouter.load(tmp_path)
    assert isinstance(again.encoder, StaticEncoder)
    reqs = [request(r, str(i)) for i, r in enumerate(test[:6])]
    for a, b in zip(asyncio.run(again.confidence(reqs)), asyncio.run(model.confidence(reqs))):
        assert a == pytest.approx(b, abs=1e-6)


def test_knn_with_the_static_encoder(static: StaticEncoder, tmp_path: Path) -> None:
    train, test = split(problems=40)
    assert KnnSettings().encoder == MINILM_STATIC
    knn = KnnEstimator.train(prompt_table(train, MODELS, False), KnnSettings(max_length=128),
                             progress=False)
    assert isinstance(knn.encoder, StaticEncoder)
    table = prompt_table(test, MODELS, False)
    quality, _ = knn.arrays(table.features)
    report = confidence_report(quality, table.correct, MODELS, 0)
    assert report["macro_map"] > report["macro_base_rate"]
    assert report["routing"]["top_confidence"] > report["routing"]["random_model"]
    knn.save(tmp_path, {"seed": 0, "holdout": 0.2})
    again = KnnEstimator.load(tmp_path)
    assert isinstance(again.encoder, StaticEncoder) and again.encoder.max_length == 128
    reqs = [request(r, str(i)) for i, r in enumerate(test[:8])]
    got = asyncio.run(knn.estimate(reqs))
    assert asyncio.run(again.estimate(reqs)) == got  # the same table, the same index
