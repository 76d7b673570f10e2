"""Capability model (LAAR section 5.2): per model, logistic regression on coarse request
features giving Q(m, x), the probability that model m answers request x correctly.

Features (one-hot): the script family of the text (character classes), the input length
bucket floor(log2(tokens + 1)), and the task type (code / math / chat markers). A model
whose training labels are all one class gets that constant.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.features import (
    LANGUAGES,
    TASKS,
    RequestFeatures,
    from_request,
    language,
    length_bucket,
    task_type,
)
from router.predictors.table import PromptTable

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class CapabilitySettings:
    length_buckets: int = 14
    """Input length buckets: floor(log2(tokens + 1)) capped at this minus one."""
    c: float = 1.0
    """Inverse L2 regularisation strength of each logistic regression."""


FEATURE_KEYS = ("length_buckets",)


def coarse(f: RequestFeatures, buckets: int) -> list[str]:
    """LAAR's features of one request: language, length bucket, task type."""
    text = f"{f.system_text}\n{f.user_text}"
    return [language(f.user_text), str(length_bucket(f.prompt_tokens, buckets)),
            task_type(text)]


def _fit(model: LogisticRegression, x: Any, y: np.ndarray) -> LogisticRegression:
    """Fit on 1 / 0 labels as they are; on P(correct) labels, as the cross-entropy of the
    soft label: every row once as correct with weight p and once as wrong with 1 - p."""
    if np.isin(y, (0.0, 1.0)).all():
        return model.fit(x, y)
    both = sparse.vstack([x, x]) if sparse.issparse(x) else np.vstack([x, x])
    return model.fit(both, np.r_[np.ones(len(y)), np.zeros(len(y))],
                     sample_weight=np.r_[y, 1.0 - y])


class CapabilityModel:
    """``capability`` satisfies ``base.CapabilityModel``."""

    KIND: ClassVar[str] = "capability"

    def __init__(self, onehot: OneHotEncoder, heads: Mapping[str, LogisticRegression | float],
                 settings: CapabilitySettings, meta: Metadata | None = None) -> None:
        self.onehot, self.heads = onehot, dict(heads)
        self.model_list = list(self.heads)
        self.models = frozenset(self.model_list)
        self.settings, self.meta = settings, meta

    def arrays(self, feats: Sequence[RequestFeatures]) -> np.ndarray:
        """(requests, models) Q(m, x)."""
        x = self.onehot.transform([coarse(f, self.settings.length_buckets) for f in feats])
        cols = [np.full(len(feats), h) if isinstance(h, float) else h.predict_proba(x)[:, 1]
                for h in self.heads.values()]
        return np.stack(cols, axis=1)

    def predict(self, feats: Sequence[RequestFeatures]) -> list[Mapping[str, float]]:
        if not feats:
            return []
        return [dict(zip(self.model_list, map(float, row))) for row in self.arrays(feats)]

    async def capability(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return self.predict([from_request(r) for r in reqs])

    @classmethod
    def train(cls, table: PromptTable, settings: CapabilitySettings,
              progress: bool = True) -> CapabilityModel:
        b = settings.length_buckets
        onehot = OneHotEncoder(handle_unknown="ignore", categories=[
            list(LANGUAGES), [str(i) for i in range(b)], list(TASKS)])
        x = onehot.fit_transform([coarse(f, b) for f in table.features])
        heads: dict[str, LogisticRegression | float] = {}
        for j, m in enumerate(table.models):
            known = ~np.isnan(table.label[:, j])
            y = table.label[known, j]
            heads[m] = float(y.mean()) if y.min() == y.max() else \
                _fit(LogisticRegression(C=settings.c, max_iter=1000), x[known], y)
        return cls(onehot, heads, settings)

    def save(self, folder: str | Path, data: dict[str, Any]) -> None:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "model.pkl", "wb") as f:
            pickle.dump((self.onehot, self.heads), f)
        s = dataclasses.asdict(self.settings)
        write_metadata(path, Metadata(
            kind=self.KIND, models=self.model_list,
            feature_settings={k: s[k] for k in FEATURE_KEYS},
            train_settings={k: v for k, v in s.items() if k not in FEATURE_KEYS},
            data=data, pickled=["scikit-learn"],
            libraries=library_versions(["scikit-learn", "numpy"])))

    @classmethod
    def load(cls, folder: str | Path, expected: Mapping[str, Any] | None = None
             ) -> CapabilityModel:
        path = Path(folder)
        meta = read_metadata(path, cls.KIND, expected)
        with open(path / "model.pkl", "rb") as f:
            onehot, heads = pickle.load(f)
        return cls(onehot, heads, CapabilitySettings(**meta.feature_settings,
                                                     **meta.train_settings), meta)
