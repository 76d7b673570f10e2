"""KNN estimator (RouteBalance section 4.2): every model's quality and output length for a
request from its k nearest training prompts, in one batched lookup.

Prompts (system + user text of each (problem, workflow, stage)) are embedded with a
sentence encoder (MiniLM distilled to a static table by default), L2-normalised, in FAISS
inner-product indexes. For neighbours i with cosine similarity s_i and weight
w_i = 1 / (1 - s_i + eps) (or, with a ``temperature`` T > 0, exp((s_i - s_max) / T); or,
with a ``band`` b > 0, 1 for s_i >= s_max - b and 0 beyond), a model's estimate is the
w-weighted mean of its known labels among them (its training mean when none of the k
neighbours has one).

Workflow stages: a request searches only the training prompts of its own stage role
(one index per role; requests of an unknown role search all), since a workflow's roles
differ far more in output length than their prompts' embeddings do. RouteBalance's
requests are single-stage, where this is the same as one index.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import faiss
import numpy as np

from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.base import QualityLength
from router.predictors.encoder import MINILM_STATIC, AnyEncoder, build_encoder, load_encoder
from router.predictors.features import RequestFeatures, from_request
from router.predictors.lexical import LEXICAL, LexicalEncoder
from router.predictors.table import PromptTable, base_rates

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class KnnSettings:
    encoder: str = MINILM_STATIC
    """Sentence encoder: ``minilm-static`` (RouteBalance's all-MiniLM-L6-v2 distilled to a
    static table, a lookup per prompt: docs/research/predictors.md, Encoders), ``minilm`` (the
    transformer itself, RouteBalance's), ``lexical`` (ours: hashed word n-grams with the
    numbers masked, ``router.predictors.lexical``), or a local Hugging Face or model2vec
    folder."""
    max_length: int = 256
    k: int = 10
    """Neighbours per lookup."""
    eps: float = 1e-3
    """Distance floor of the inverse-distance weights."""
    temperature: float = 0.0
    """0: RouteBalance's inverse-distance weights. T > 0 (ours): w_i = exp((s_i - s_max) / T)
    (``neighbour_weights``), so the nearest prompt dominates: on math, a problem of the same
    template (docs/research/predictors.md, "Math's templates")."""
    band: float = 0.0
    """0: off. b > 0 (ours): w_i = 1 for the neighbours with s_i >= s_max - b, 0 for the
    rest (``neighbour_weights``): those about as similar as the nearest count equally, so on
    math the problems of one template are pooled as the template ceiling pools them
    (docs/research/predictors.md, "How far math can be predicted"). Not with a temperature."""

    def __post_init__(self) -> None:
        finite = 0 <= self.temperature < float("inf") and 0 <= self.band < float("inf")
        if not (self.k >= 1 and self.eps > 0 and finite
                and not (self.temperature > 0 and self.band > 0)):
            raise ValueError(f"KnnSettings: k >= 1, eps > 0, a finite temperature >= 0 and "
                             f"band >= 0, not both above 0 (got k={self.k}, eps={self.eps}, "
                             f"temperature={self.temperature}, band={self.band})")


FEATURE_KEYS = ("encoder", "max_length")


def prompt_text(f: RequestFeatures) -> str:
    return f"{f.system_text}\n{f.user_text}".strip()


def inverse_distance_weights(similarity: np.ndarray, eps: float) -> np.ndarray:
    """w_i = 1 / (1 - s_i + eps)."""
    return 1.0 / (1.0 - similarity + eps)


def neighbour_weights(similarity: np.ndarray, settings: KnnSettings) -> np.ndarray:
    """(queries, k) weights of neighbours sorted by decreasing ``similarity``:
    ``inverse_distance_weights``, or exp((s_i - s_max) / T) with ``settings.temperature``
    T > 0, or 1 within ``settings.band`` b > 0 of the nearest (s_i >= s_max - b), else 0."""
    if settings.band > 0:
        return (similarity >= similarity[:, :1] - settings.band).astype(np.float64)
    if settings.temperature == 0:
        return inverse_distance_weights(similarity, settings.eps)
    return np.exp((similarity - similarity[:, :1]) / settings.temperature)


def weighted_means(labels: np.ndarray, weights: np.ndarray, fallback: np.ndarray
                   ) -> np.ndarray:
    """(queries, models): sum_i w_i y_im / sum_i w_i over known y_im; ``fallback`` else.

    ``labels`` is (queries, k, models) with NaN for unknown, ``weights`` (queries, k)."""
    return known_weighted_means(np.nan_to_num(labels), ~np.isnan(labels), weights, fallback)


def known_weighted_means(values: np.ndarray, known: np.ndarray, weights: np.ndarray,
                         fallback: np.ndarray) -> np.ndarray:
    """``weighted_means`` of labels already split into ``values`` (unknowns as 0) and the
    ``known`` mask (the training table's, split once at load)."""
    w = weights[:, :, None] * known
    total = w.sum(1)
    est = (values * w).sum(1) / np.where(total > 0, total, 1)
    return np.where(total > 0, est, fallback[None, :])


def _index(embeddings: np.ndarray, rows: Sequence[int]) -> tuple[faiss.Index, np.ndarray]:
    """An exact inner-product index over ``rows`` of ``embeddings``, and those rows."""
    ids = np.asarray(rows, dtype=np.int64)
    index = faiss.IndexFlatIP(embeddings.shape[1])
    index.add(np.ascontiguousarray(embeddings[ids], dtype=np.float32))
    return index, ids


class KnnEstimator:
    """``estimate`` satisfies ``base.QualityLengthEstimator``."""

    KIND: ClassVar[str] = "knn"

    def __init__(self, encoder: AnyEncoder, embeddings: np.ndarray, stages: Sequence[str],
                 quality: np.ndarray, tokens: np.ndarray, models: Sequence[str],
                 settings: KnnSettings, meta: Metadata | None = None) -> None:
        self.encoder, self.embeddings, self.stages = encoder, embeddings, list(stages)
        self.indexes = {s: _index(embeddings, [i for i, t in enumerate(stages) if t == s])
                        for s in set(stages)}
        self.indexes[""] = _index(embeddings, range(len(stages)))
        self.quality, self.tokens = quality, tokens
        self.model_list = list(models)
        self.models = frozenset(self.model_list)
        self.settings, self.meta = settings, meta
        self.quality_mean = np.nan_to_num(base_rates(quality))
        self.tokens_mean = np.nan_to_num(base_rates(tokens))
        self._known = {"quality": (np.nan_to_num(quality), ~np.isnan(quality)),
                       "tokens": (np.nan_to_num(tokens), ~np.isnan(tokens))}
        """Each label table split once: values with unknowns as 0, and the known mask."""

    def arrays(self, feats: Sequence[RequestFeatures]) -> tuple[np.ndarray, np.ndarray]:
        """(queries, models) quality and output-token estimates."""
        emb = self.encoder.embed([prompt_text(f) for f in feats])
        q = np.empty((len(feats), len(self.model_list)))
        n = np.empty_like(q)
        by_stage: dict[str, list[int]] = {}
        for i, f in enumerate(feats):
            by_stage.setdefault(f.stage if f.stage in self.indexes else "", []).append(i)
        for stage, mine in by_stage.items():
            index, rows = self.indexes[stage]
            sim, pos = index.search(emb[mine], min(self.settings.k, index.ntotal))
            idx, w = rows[pos], neighbour_weights(sim, self.settings)
            (qv, qk), (nv, nk) = self._known["quality"], self._known["tokens"]
            q[mine] = known_weighted_means(qv[idx], qk[idx], w, self.quality_mean)
            n[mine] = known_weighted_means(nv[idx], nk[idx], w, self.tokens_mean)
        return q, n

    def predict(self, feats: Sequence[RequestFeatures]
                ) -> list[Mapping[str, QualityLength]]:
        if not feats:
            return []
        q, n = self.arrays(feats)
        return [{m: QualityLength(float(q[i, j]), float(n[i, j]))
                 for j, m in enumerate(self.model_list)} for i in range(len(feats))]

    async def estimate(self, reqs: Sequence[RoutingRequest]
                       ) -> list[Mapping[str, QualityLength]]:
        return self.predict([from_request(r) for r in reqs])

    @classmethod
    def train(cls, table: PromptTable, settings: KnnSettings, progress: bool = True
              ) -> KnnEstimator:
        texts = [prompt_text(f) for f in table.features]
        encoder = (LexicalEncoder.fit(texts, settings.max_length)
                   if settings.encoder == LEXICAL else
                   build_encoder(settings.encoder, max_length=settings.max_length))
        emb = encoder.embed(texts, progress=progress)
        return cls(encoder, emb, [f.stage for f in table.features], table.label,
                   table.output_tokens, table.models, settings)

    def save(self, folder: str | Path, data: dict[str, Any]) -> None:
        path = Path(folder)
        self.encoder.save(path / "encoder")
        np.savez_compressed(path / "index.npz", embeddings=self.embeddings,  # lexical: sparse
                            stages=np.array(self.stages), quality=self.quality,
                            tokens=self.tokens)
        s = dataclasses.asdict(self.settings)
        s["encoder"] = Path(s["encoder"]).name
        write_metadata(path, Metadata(
            kind=self.KIND, models=self.model_list,
            feature_settings={k: s[k] for k in FEATURE_KEYS},
            train_settings={k: v for k, v in s.items() if k not in FEATURE_KEYS},
            data=data,
            libraries=library_versions(["faiss-cpu", "torch", "transformers", "model2vec"])))

    @classmethod
    def load(cls, folder: str | Path, expected: Mapping[str, Any] | None = None
             ) -> KnnEstimator:
        path = Path(folder)
        meta = read_metadata(path, cls.KIND, expected)
        settings = KnnSettings(**meta.feature_settings, **meta.train_settings)
        arrays = np.load(path / "index.npz")
        return cls(load_encoder(path / "encoder", max_length=settings.max_length),
                   arrays["embeddings"], list(arrays["stages"]), arrays["quality"],
                   arrays["tokens"], meta.models, settings, meta)
