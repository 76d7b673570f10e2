"""Semantic router (Chimera section 3.3): encoder + multi-label linear head, q[m] = sigmoid.

Trained with binary cross-entropy on (prompt, model, correct?) labels, one independent
sigmoid per candidate model, on the first stage's user prompt of each workflow run (the
request whose model the router chooses). Any local Hugging Face encoder works; CPU
inference in batches, the head through numpy (issue 33).

Two ways to train, by the encoder's kind (``encoder.build_encoder``):
- a transformer is fine-tuned with its head (Chimera's recipe: AdamW, ``epochs``, ``lr``,
  ``batch_size``);
- a static encoder (``minilm-static``, the default since issue 33: a lookup, not a
  forward pass) is fine-tuned the same way, its table as a trainable bag of token vectors
  (mean, L2-normalised, times ``static_scale``) under the head, with its own learning
  rates and epochs (chosen on validation splits inside the training problems,
  docs/research/predictors.md); the scale is folded into the saved head, so serving is
  ``sigmoid(head(embed(text)))`` as for any encoder.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from scipy.special import expit
from tqdm import tqdm

from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.encoder import (MINILM_STATIC, AnyEncoder, StaticEncoder,
                                       build_encoder, load_encoder)
from router.predictors.features import RequestFeatures, from_request
from router.predictors.table import PromptTable, base_rates

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class SemanticSettings:
    encoder: str = MINILM_STATIC
    """``minilm-static`` (MiniLM distilled to a static table: docs/research/predictors.md, Encoders),
    ``minilm`` (fine-tuned MiniLM), or a local Hugging Face or model2vec folder. Chimera
    section 4 used ModernBERT-large (not available offline here)."""
    pooling: str = "mean"
    """``mean`` over tokens or the ``cls`` token."""
    max_length: int = 256
    """Encoder input truncation (tokens)."""
    epochs: int = 5
    """Chimera section 3.3 (training details): 5 epochs."""
    lr: float = 1e-5
    """Chimera section 3.3: learning rate 1e-5 (AdamW)."""
    batch_size: int = 16
    """Chimera section 3.3: batch size 16."""
    static_epochs: int = 10
    """Static encoders: epochs of fine-tuning (batch ``batch_size``)."""
    static_lr: float = 3e-3
    """Static encoders: learning rate of the token table (AdamW without weight decay over
    the rows of the tokens the training prompts hold; the rest keep their values)."""
    static_head_lr: float = 1e-2
    """Static encoders: learning rate of the head (AdamW)."""
    static_scale: float = 10.0
    """Static encoders: the unit-norm embedding is multiplied by this before the head
    during training (a temperature; folded into the saved head's weights)."""
    seed: int = 0


FEATURE_KEYS = ("encoder", "pooling", "max_length")


def logit(p: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)), p clipped to [1e-4, 1 - 1e-4]."""
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def masked_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy over the known (non-NaN) labels."""
    known = ~torch.isnan(labels)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits[known], labels[known])


class StaticBag(torch.nn.Module):
    """A static encoder's table as a trainable module: the L2-normalised mean of a text's
    token vectors (what ``StaticEncoder.embed`` serves). Only the rows of tokens that occur
    in ``texts`` (the training prompts) are parameters; every other row keeps its value."""

    def __init__(self, encoder: StaticEncoder, texts: Sequence[str]) -> None:
        super().__init__()
        self.source = encoder
        self.vocab = np.unique([t for ids in encoder.token_ids(texts) for t in ids]
                               ).astype(np.int64)
        self.compact = np.full(len(encoder.vectors), -1, np.int64)
        self.compact[self.vocab] = np.arange(len(self.vocab))
        self.table = torch.nn.Parameter(torch.from_numpy(encoder.vectors[self.vocab]))

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """A (texts x vocabulary) matrix of token shares times the table: the means (a
        dense product is faster here than ``EmbeddingBag``'s backward)."""
        shares = np.zeros((len(texts), len(self.vocab)), np.float32)
        for row, ids in enumerate(self.source.token_ids(texts)):
            ids = self.compact[ids]
            ids = ids[ids >= 0]  # tokens no training prompt has (none while training)
            if len(ids):
                np.add.at(shares[row], ids, 1.0 / len(ids))
        return torch.nn.functional.normalize(torch.from_numpy(shares) @ self.table, dim=-1)

    def trained(self) -> StaticEncoder:
        vectors = self.source.vectors.copy()
        vectors[self.vocab] = self.table.detach().numpy()
        return self.source.with_vectors(vectors)


class SemanticRouter:
    """The trained router; ``confidence`` satisfies ``base.SemanticRouter``."""

    KIND: ClassVar[str] = "semantic_router"

    def __init__(self, encoder: AnyEncoder, head: torch.nn.Linear, models: Sequence[str],
                 settings: SemanticSettings, meta: Metadata | None = None) -> None:
        self.encoder, self.head, self.model_list = encoder, head, list(models)
        self.models = frozenset(self.model_list)
        self.settings, self.meta = settings, meta
        self._weight_t = head.weight.detach().numpy().T.copy()
        """The head as float32 numpy arrays: a (1 x dim) product and a sigmoid cost a few
        microseconds in numpy (scipy's ``expit``: no overflow warning), tens through torch's dispatch (equal to the torch head
        within float32 rounding: tests/unit/test_predictor_semantic.py)."""
        self._bias = head.bias.detach().numpy().copy()

    # ---- inference ----

    def predict(self, feats: Sequence[RequestFeatures], batch_size: int = 32
                ) -> list[Mapping[str, float]]:
        out: list[Mapping[str, float]] = []
        for i in range(0, len(feats), batch_size):
            emb = self._embed([f.user_text for f in feats[i:i + batch_size]])
            q = expit(emb @ self._weight_t + self._bias)
            out += [dict(zip(self.model_list, row)) for row in q.tolist()]
        return out

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 embeddings, one row per text."""
        if isinstance(self.encoder, StaticEncoder):
            return self.encoder.embed(texts)
        self.encoder.eval()
        with torch.inference_mode():
            return self.encoder(texts).float().numpy()

    async def confidence(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return self.predict([from_request(r) for r in reqs])

    # ---- training ----

    @classmethod
    def train(cls, table: PromptTable, settings: SemanticSettings,
              progress: bool = True) -> SemanticRouter:
        torch.manual_seed(settings.seed)
        rng = random.Random(settings.seed)
        encoder = build_encoder(settings.encoder, settings.pooling, normalize=False,
                                max_length=settings.max_length)
        head = torch.nn.Linear(encoder.dim, len(table.models))
        with torch.no_grad():  # start at each model's base rate
            head.bias.copy_(torch.tensor(logit(np.nan_to_num(base_rates(table.label),
                                                               nan=0.5))))
        if isinstance(encoder, StaticEncoder):
            body: torch.nn.Module = StaticBag(encoder, [f.user_text for f in table.features])
            scale, epochs = settings.static_scale, settings.static_epochs
            opt = torch.optim.AdamW([
                {"params": body.parameters(), "lr": settings.static_lr, "weight_decay": 0.0},
                {"params": head.parameters(), "lr": settings.static_head_lr}])
        else:
            body, scale, epochs = encoder, 1.0, settings.epochs
            opt = torch.optim.AdamW(list(body.parameters()) + list(head.parameters()),
                                    lr=settings.lr)
        threads = torch.get_num_threads()
        if isinstance(body, StaticBag):  # small tensors: threads only contend (10x slower)
            torch.set_num_threads(1)
        try:
            order = list(range(len(table.features)))
            labels = torch.tensor(table.label, dtype=torch.float32)
            steps = epochs * -(-len(order) // settings.batch_size)
            bar = tqdm(total=steps, desc="semantic router", disable=not progress, unit="batch")
            body.train()
            for _ in range(epochs):
                rng.shuffle(order)
                for i in range(0, len(order), settings.batch_size):
                    idx = order[i:i + settings.batch_size]
                    texts = [table.features[j].user_text for j in idx]
                    loss = masked_bce(head(body(texts) * scale), labels[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    bar.update()
                    bar.set_postfix(loss=f"{loss.item():.3f}")
            bar.close()
        finally:
            torch.set_num_threads(threads)
        if isinstance(body, StaticBag):
            encoder = body.trained()
            with torch.no_grad():
                head.weight.mul_(scale)
        return cls(encoder, head, table.models, settings)

    # ---- artifact ----

    def save(self, folder: str | Path, data: dict[str, Any]) -> None:
        path = Path(folder)
        self.encoder.save(path / "encoder")
        torch.save(self.head.state_dict(), path / "head.pt")
        s = dataclasses.asdict(self.settings)
        s["encoder"] = Path(s["encoder"]).name  # a folder by its name, never a machine path
        write_metadata(path, Metadata(
            kind=self.KIND, models=self.model_list,
            feature_settings={k: s[k] for k in FEATURE_KEYS},
            train_settings={k: v for k, v in s.items() if k not in FEATURE_KEYS},
            data=data, libraries=library_versions(["torch", "transformers", "model2vec"])))

    @classmethod
    def load(cls, folder: str | Path, expected: Mapping[str, Any] | None = None
             ) -> SemanticRouter:
        path = Path(folder)
        meta = read_metadata(path, cls.KIND, expected)
        f = meta.feature_settings
        settings = SemanticSettings(**f, **meta.train_settings)
        encoder = load_encoder(path / "encoder", f["pooling"], normalize=False,
                               max_length=f["max_length"])
        head = torch.nn.Linear(encoder.dim, len(meta.models))
        head.load_state_dict(torch.load(path / "head.pt", weights_only=True))
        return cls(encoder, head, meta.models, settings, meta)

