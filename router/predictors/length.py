"""Workflow length predictor (Chimera section 3.4): a quantile random forest predicting the
total remaining output tokens of a workflow from the current stage on, per model.

Features, as the paper lists them: token counts of the system prompt, the user prompt
and the full input; workflow id and stage (categorical, one-hot); the model (one-hot:
one forest answers for every model by varying this column); a TF-IDF uni/bi-gram sketch
of the user prompt reduced by truncated SVD. The median is the prediction; any other
quantile is available for SLO use (``quantiles``).

Departures from the paper, on by default because they ranked better on a validation split
inside the training problems (docs/predictors.md, Results): the stage index as a numeric
column, a log target and half the features per split. ``LengthSettings(stage_index=False,
log_target=False, max_features=1.0)`` is the paper's predictor, and what an artifact whose
metadata lacks these keys was trained as (``LEGACY``).
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np
from quantile_forest import RandomForestQuantileRegressor
from scipy import sparse
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.preprocessing import OneHotEncoder
from tqdm import tqdm

from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.encoder import MINILM, TokenCounter, load_tokenizer, resolve_encoder
from router.predictors.features import RequestFeatures, from_record, from_request
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
    seed: int = 0


FEATURE_KEYS = ("tokenizer", "svd_components", "tfidf_max_features", "stage_index")
LEGACY = {"stage_index": False, "log_target": False, "max_features": 1.0}
"""The values of keys added after the first artifacts: what a metadata without them means."""


class LengthPredictor:
    """``remaining_tokens`` satisfies ``base.LengthPredictor``."""

    KIND: ClassVar[str] = "length"

    def __init__(self, counter: TokenCounter, onehot: OneHotEncoder, tfidf: TfidfVectorizer,
                 svd: TruncatedSVD, forest: RandomForestQuantileRegressor,
                 models: Sequence[str], settings: LengthSettings,
                 meta: Metadata | None = None) -> None:
        self.counter, self.onehot, self.tfidf, self.svd = counter, onehot, tfidf, svd
        self.forest, self.model_list = forest, list(models)
        self.models = frozenset(self.model_list)
        self.settings, self.meta = settings, meta

    # ---- features ----

    def _matrix(self, feats: Sequence[RequestFeatures], models: Sequence[str]) -> np.ndarray:
        """One row per (feature, model) pair, in that order."""
        sys_n = self.counter.counts([f.system_text for f in feats])
        user_n = self.counter.counts([f.user_text for f in feats])
        unknown = [i for i, f in enumerate(feats) if f.prompt_tokens <= 0]
        full_n = [f.prompt_tokens for f in feats]
        for i, n in zip(unknown, self.counter.counts([feats[i].prompt_text for i in unknown])):
            full_n[i] = n
        counts = np.array([sys_n, user_n, full_n], dtype=np.float64).T
        cats = self.onehot.transform([[f.workflow, f.stage, m] for f, m in zip(feats, models)])
        sketch = self.svd.transform(self.tfidf.transform([f.user_text for f in feats]))
        cols = [counts, sparse.csr_matrix(cats).toarray(), sketch]
        if self.settings.stage_index:
            cols.append(np.array([[f.stage_index] for f in feats], dtype=np.float64))
        return np.hstack(cols)

    def _forest_quantiles(self, x: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
        """(rows, quantiles) remaining tokens, back from the log scale if trained on it."""
        pred = np.asarray(self.forest.predict(x, quantiles=list(quantiles))).reshape(len(x), -1)
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
        return [{m: q[0] for m, q in row.items()}
                for row in self.quantiles(feats, [self.settings.quantile])]

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
        model = cls(counter, onehot, tfidf, svd, forest, models, s)
        x = model._matrix(feats, [r.model for r in records])
        steps.update()
        y = np.array([r.remaining_tokens for r in records], dtype=np.float64)
        forest.fit(x, np.log1p(y) if s.log_target else y)
        steps.update()
        steps.close()
        return model

    # ---- artifact ----

    def save(self, folder: str | Path, data: dict[str, Any]) -> None:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        self.counter.tokenizer.save_pretrained(str(path / "tokenizer"))
        with open(path / "model.pkl", "wb") as f:
            pickle.dump((self.onehot, self.tfidf, self.svd, self.forest), f)
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
            onehot, tfidf, svd, forest = pickle.load(f)
        settings = LengthSettings(**{**LEGACY, **meta.feature_settings, **meta.train_settings})
        return cls(TokenCounter(load_tokenizer(path / "tokenizer")), onehot, tfidf, svd,
                   forest, meta.models, settings, meta)
