"""Workflow length predictor (Chimera section 3.4): a quantile random forest predicting the
total remaining output tokens of a workflow from the current stage on, per model.

Features, as the paper lists them: token counts of the system prompt, the user prompt
and the full input; workflow id and stage (categorical, one-hot); the model (one-hot:
one forest answers for every model by varying this column); a TF-IDF uni/bi-gram sketch
of the user prompt reduced by truncated SVD. The median is the prediction; any other
quantile is available for SLO use (``quantiles``).

Departures from the paper, on by default because they ranked better on a validation split
inside the training problems (docs/research/predictors.md, Results): the stage index as a numeric
column, a log target and half the features per split. ``LengthSettings(stage_index=False,
log_target=False, max_features=1.0)`` is the paper's predictor, and what an artifact whose
metadata lacks these keys was trained as (``LEGACY``).
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

import numba
import numpy as np
from quantile_forest import RandomForestQuantileRegressor
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.preprocessing import OneHotEncoder
from tqdm import tqdm

from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.encoder import MINILM, TokenCounter, load_tokenizer, resolve_encoder
from router.predictors.features import RequestFeatures, from_record, from_request
from router.predictors.flat_forest import FlatForest
from router.predictors.records import StageRecord

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class LengthSettings:
    tokenizer: str = MINILM
    """Tokenizer (a local Hugging Face folder, or ``minilm``) counting the system and
    user prompt tokens; the full input count is the engine's."""
    svd_components: int = 32
    """Dimensions of the TF-IDF sketch after truncated SVD (Chimera section 3.4 names the
    sketch, not its size; at most the vocabulary size minus one)."""
    tfidf_max_features: int = 20000
    """Vocabulary cap of the TF-IDF uni/bi-grams."""
    n_estimators: int = 100
    """Trees of the quantile forest."""
    min_samples_leaf: int = 5
    """Training rows per leaf: the quantiles of a prediction pool the leaves' targets."""
    stage_index: bool = True
    """Add the stage's 0-based position in its workflow as a numeric column (the stage
    one-hot names the role, which repeats: a second ``coder`` stage has less left to do).
    Departs from Chimera's listed features; False reproduces them."""
    log_target: bool = True
    """Fit the forest to log(1 + remaining tokens) and map its quantiles back (quantiles
    commute with the monotone map up to interpolation; the splits change). Departs from
    Chimera (raw tokens)."""
    max_features: float = 0.5
    """Share of the columns each split considers (scikit-learn's default for regression,
    and Chimera's forest as far as the paper says, is 1.0)."""
    quantile: float = 0.5
    """The predicted quantile (Chimera: the median)."""
    n_jobs: int = 1
    """Training / prediction threads of the forest."""
    flat_forest: bool = True
    """Serve ``quantile`` from the forest flattened into arrays (``flat_forest.FlatForest``:
    the mean over trees of each leaf's quantile, well under a millisecond per request)
    instead of the quantile regression forest's pooled leaf samples (about 20 ms at batch
    1); other quantiles always come from the latter. Issue 33; docs/research/predictors.md."""
    seed: int = 0


FEATURE_KEYS = ("tokenizer", "svd_components", "tfidf_max_features", "stage_index")
LEGACY = {"stage_index": False, "log_target": False, "max_features": 1.0,
          "flat_forest": False}
"""The values of keys added after the first artifacts: what a metadata without them means."""


def word_analyzer(tfidf: TfidfVectorizer) -> Callable[[str], list[str]]:
    """``tfidf.build_analyzer()``; for the settings ``train`` fits (lower-cased word uni- and
    bigrams of a token pattern without groups, nothing else) the same n-grams in the same
    order from two C-level steps: scikit-learn's ``_word_ngrams`` joins each bigram in a
    Python loop, a quarter of the sketch's time."""
    pattern = re.compile(tfidf.token_pattern) if tfidf.token_pattern else None
    if (pattern is None or pattern.groups or tfidf.analyzer != "word"
            or tuple(tfidf.ngram_range) != (1, 2) or not tfidf.lowercase
            or tfidf.input != "content" or tfidf.preprocessor is not None
            or tfidf.tokenizer is not None or tfidf.strip_accents is not None
            or tfidf.stop_words is not None):
        return tfidf.build_analyzer()
    find = pattern.findall

    def analyze(text: str) -> list[str]:
        tokens = find(text.lower())
        return tokens + list(map(" ".join, zip(tokens, tokens[1:])))
    return analyze


@numba.njit(cache=True, nogil=True)
def project(ids: np.ndarray, counts: np.ndarray, idf: np.ndarray, terms: np.ndarray
            ) -> np.ndarray:
    """One text's sketch: sublinear TF x IDF of its known n-grams (``ids``, ``counts``),
    L2-normalised, times their rows of ``terms`` (vocabulary x components), in one pass
    (the numpy form paid a call's overhead per step: a third of the sketch)."""
    out = np.zeros(terms.shape[1])
    norm2 = 0.0
    for j in range(ids.shape[0]):
        w = (1.0 + np.log(counts[j])) * idf[ids[j]]
        norm2 += w * w
        for k in range(terms.shape[1]):
            out[k] += terms[ids[j], k] * w
    return out / np.sqrt(norm2)


class LengthPredictor:
    """``remaining_tokens`` satisfies ``base.LengthPredictor``."""

    KIND: ClassVar[str] = "length"
    ONEHOT_MEMO: ClassVar[int] = 4096
    """Distinct (workflow, stage, model) rows whose one-hot encoding is remembered."""

    def __init__(self, counter: TokenCounter, onehot: OneHotEncoder, tfidf: TfidfVectorizer,
                 svd: TruncatedSVD, forest: RandomForestQuantileRegressor,
                 flat: FlatForest | None, models: Sequence[str], settings: LengthSettings,
                 meta: Metadata | None = None) -> None:
        self.counter, self.onehot, self.tfidf, self.svd = counter, onehot, tfidf, svd
        self.forest, self.flat, self.model_list = forest, flat, list(models)
        self.models = frozenset(self.model_list)
        self.settings, self.meta = settings, meta
        self._categories = [{c: i for i, c in enumerate(cats)} for cats in onehot.categories_]
        widths = [len(c) for c in self._categories]
        self._onehot_starts = list(itertools.accumulate([0, *widths[:-1]]))
        self._onehot_width = sum(widths)
        self._onehot_rows: dict[tuple[str, str, str], np.ndarray] = {}
        self._analyze = word_analyzer(tfidf)
        self._term_components = np.ascontiguousarray(svd.components_.T)
        """(vocabulary, components): a term's SVD loadings in one row (a few cache lines;
        a column of ``components_`` spans one line per component)."""

    # ---- features ----

    def _matrix(self, feats: Sequence[RequestFeatures], models: Sequence[str]) -> np.ndarray:
        """One row per (feature, model) pair, in that order: token counts, one-hot, sketch,
        stage index. The text columns are computed once per distinct request
        (``quantiles`` repeats each for every model); the one-hot and the TF-IDF sketch as
        the fitted scikit-learn transforms compute them (tested equal), without their
        per-call validation (milliseconds at batch 1)."""
        index: dict[int, int] = {}
        distinct: list[RequestFeatures] = []
        for f in feats:
            if id(f) not in index:
                index[id(f)] = len(distinct)
                distinct.append(f)
        rows = [index[id(f)] for f in feats]
        counts, sketch = self._text_columns(distinct)
        onehot = self._onehot([(f.workflow, f.stage, m) for f, m in zip(feats, models)])
        a, b = 3 + onehot.shape[1], 3 + onehot.shape[1] + sketch.shape[1]
        x = np.empty((len(feats), b + self.settings.stage_index))
        x[:, :3], x[:, 3:a], x[:, a:b] = counts[rows], onehot, sketch[rows]
        if self.settings.stage_index:
            x[:, b] = [f.stage_index for f in feats]
        return x

    def _text_columns(self, feats: Sequence[RequestFeatures]) -> tuple[np.ndarray, np.ndarray]:
        """Per request: system, user and full-input token counts; the sketch."""
        n = len(feats)
        unknown = [i for i, f in enumerate(feats) if f.prompt_tokens <= 0]
        counted = self.counter.counts([f.system_text for f in feats] +
                                      [f.user_text for f in feats] +
                                      [feats[i].prompt_text for i in unknown])
        full_n = [f.prompt_tokens for f in feats]
        for i, c in zip(unknown, counted[2 * n:]):
            full_n[i] = c
        counts = np.array([counted[:n], counted[n:2 * n], full_n], dtype=np.float64).T
        return counts, self._sketch([f.user_text for f in feats])

    def _onehot(self, rows: Sequence[tuple[str, str, str]]) -> np.ndarray:
        """``OneHotEncoder(handle_unknown="ignore").transform``: an unseen value is zeros.
        Each distinct row is encoded once and remembered (workflows, stages and models
        repeat; at most ``ONEHOT_MEMO`` rows, then the memo restarts)."""
        memo = self._onehot_rows
        out = np.empty((len(rows), self._onehot_width))
        for i, row in enumerate(rows):
            encoded = memo.get(row)
            if encoded is None:
                if len(memo) >= self.ONEHOT_MEMO:
                    memo.clear()
                encoded = memo[row] = np.zeros(self._onehot_width)
                for start, cats, value in zip(self._onehot_starts, self._categories, row):
                    j = cats.get(value)
                    if j is not None:
                        encoded[start + j] = 1.0
            out[i] = encoded
        return out

    def _sketch(self, texts: Sequence[str]) -> np.ndarray:
        """``svd.transform(tfidf.transform(texts))``: sublinear TF x IDF over the fitted
        vocabulary, L2-normalised, projected on the SVD's components."""
        vocab, idf, terms = self.tfidf.vocabulary_, self.tfidf.idf_, self._term_components
        out = np.zeros((len(texts), terms.shape[1]))
        for i, text in enumerate(texts):
            grams = Counter(filter(vocab.__contains__, self._analyze(text)))
            if grams:
                out[i] = project(np.fromiter(map(vocab.__getitem__, grams), np.intp, len(grams)),
                                 np.fromiter(grams.values(), np.float64, len(grams)), idf, terms)
        return out

    def _forest_quantiles(self, x: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
        """(rows, quantiles) remaining tokens, back from the log scale if trained on it;
        the served quantile from the flat forest when there is one."""
        pred = np.empty((len(x), len(quantiles)))
        served = [self.flat is not None and q == self.settings.quantile for q in quantiles]
        pooled = [j for j, s in enumerate(served) if not s]
        if pooled:
            pred[:, pooled] = np.asarray(self.forest.predict(
                x, quantiles=[quantiles[j] for j in pooled])).reshape(len(x), -1)
        if any(served):
            pred[:, served] = self.flat.predict(x)[:, None]  # type: ignore[union-attr]
        return np.expm1(pred) if self.settings.log_target else pred

    # ---- inference ----

    def quantiles(self, feats: Sequence[RequestFeatures], quantiles: Sequence[float]
                  ) -> list[dict[str, list[float]]]:
        """Per request and model, the remaining-token ``quantiles``."""
        if not feats:
            return []
        ms = self.model_list
        rows = [f for f in feats for _ in ms]
        pred = self._forest_quantiles(self._matrix(rows, ms * len(feats)), quantiles)
        return [{m: list(map(float, pred[i * len(ms) + j])) for j, m in enumerate(ms)}
                for i in range(len(feats))]

    def predict(self, feats: Sequence[RequestFeatures]) -> list[Mapping[str, float]]:
        """The served quantile per request and model (``quantiles`` of it alone; from the
        flat forest without the general path's per-quantile bookkeeping)."""
        if self.flat is None:
            return [{m: q[0] for m, q in row.items()}
                    for row in self.quantiles(feats, [self.settings.quantile])]
        if not feats:
            return []
        ms = self.model_list
        pred = self.flat.predict(self._matrix([f for f in feats for _ in ms], ms * len(feats)))
        if self.settings.log_target:
            pred = np.expm1(pred)
        return [dict(zip(ms, pred[i * len(ms):(i + 1) * len(ms)].tolist()))
                for i in range(len(feats))]

    def predict_own(self, records: Sequence[StageRecord],
                    quantiles: Sequence[float]) -> np.ndarray:
        """(records, quantiles) predictions for each record's own model."""
        return self._forest_quantiles(self._matrix([from_record(r) for r in records],
                                                   [r.model for r in records]), quantiles)

    async def remaining_tokens(self, reqs: Sequence[RoutingRequest]
                               ) -> list[Mapping[str, float]]:
        return self.predict([from_request(r) for r in reqs])

    # ---- training ----

    @classmethod
    def train(cls, records: Sequence[StageRecord], settings: LengthSettings,
              progress: bool = True) -> LengthPredictor:
        s = settings
        steps = tqdm(total=3, desc="length predictor", disable=not progress)
        counter = TokenCounter(load_tokenizer(resolve_encoder(s.tokenizer)))
        feats = [from_record(r) for r in records]
        models = sorted({r.model for r in records})
        onehot = OneHotEncoder(handle_unknown="ignore").fit(
            [[f.workflow, f.stage, r.model] for f, r in zip(feats, records)])
        tfidf = TfidfVectorizer(ngram_range=(1, 2), max_features=s.tfidf_max_features,
                                sublinear_tf=True)
        tf = tfidf.fit_transform([f.user_text for f in feats])
        svd = TruncatedSVD(n_components=max(1, min(s.svd_components, tf.shape[1] - 1)),
                           random_state=s.seed).fit(tf)
        steps.update()
        forest = RandomForestQuantileRegressor(
            n_estimators=s.n_estimators, min_samples_leaf=s.min_samples_leaf,
            max_features=s.max_features, default_quantiles=s.quantile, n_jobs=s.n_jobs,
            random_state=s.seed)
        model = cls(counter, onehot, tfidf, svd, forest, None, models, s)
        x = model._matrix(feats, [r.model for r in records])
        steps.update()
        y = np.array([r.remaining_tokens for r in records], dtype=np.float64)
        target = np.log1p(y) if s.log_target else y
        forest.fit(x, target)
        if s.flat_forest:
            model.flat = FlatForest.of(forest.estimators_, x, target, s.quantile)
        steps.update()
        steps.close()
        return model

    # ---- artifact ----

    def save(self, folder: str | Path, data: dict[str, Any]) -> None:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        self.counter.tokenizer.save_pretrained(str(path / "tokenizer"))
        with open(path / "model.pkl", "wb") as f:
            pickle.dump((self.onehot, self.tfidf, self.svd, self.forest, self.flat), f)
        s = dataclasses.asdict(self.settings)
        s["tokenizer"] = Path(s["tokenizer"]).name
        write_metadata(path, Metadata(
            kind=self.KIND, models=self.model_list,
            feature_settings={k: s[k] for k in FEATURE_KEYS},
            train_settings={k: v for k, v in s.items() if k not in FEATURE_KEYS},
            data=data, pickled=["scikit-learn", "quantile-forest"],
            libraries=library_versions(["scikit-learn", "quantile-forest", "numpy"])))

    @classmethod
    def load(cls, folder: str | Path, expected: Mapping[str, Any] | None = None
             ) -> LengthPredictor:
        path = Path(folder)
        meta = read_metadata(path, cls.KIND, expected)
        with open(path / "model.pkl", "rb") as f:
            onehot, tfidf, svd, forest, *flat = pickle.load(f)  # no flat forest before it
        settings = LengthSettings(**{**LEGACY, **meta.feature_settings, **meta.train_settings})
        return cls(TokenCounter(load_tokenizer(path / "tokenizer")), onehot, tfidf, svd,
                   forest, flat[0] if flat else None, meta.models, settings, meta)
