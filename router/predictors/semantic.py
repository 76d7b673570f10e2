"""Semantic router (Chimera section 3.3): encoder + multi-label linear head, q[m] = sigmoid.

Trained with binary cross-entropy on (prompt, model, correct?) labels, one independent
sigmoid per candidate model, on the first stage's user prompt of each workflow run (the
request whose model the router chooses). Any local Hugging Face encoder works; CPU
inference in batches under ``torch.inference_mode``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.encoder import MINILM, Encoder, resolve_encoder
from router.predictors.features import RequestFeatures, from_request
from router.predictors.table import PromptTable, base_rates

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class SemanticSettings:
    encoder: str = MINILM
    """Local Hugging Face encoder folder, or ``minilm``. Chimera section 4 used
    ModernBERT-large (not available offline here)."""
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


class SemanticRouter:
    """The trained router; ``confidence`` satisfies ``base.SemanticRouter``."""

    KIND: ClassVar[str] = "semantic_router"

    def __init__(self, encoder: Encoder, head: torch.nn.Linear, models: Sequence[str],
                 settings: SemanticSettings, meta: Metadata | None = None) -> None:
        self.encoder, self.head, self.model_list = encoder, head, list(models)
        self.models = frozenset(self.model_list)
        self.settings, self.meta = settings, meta

    # ---- inference ----

    @torch.inference_mode()
    def predict(self, feats: Sequence[RequestFeatures], batch_size: int = 32
                ) -> list[Mapping[str, float]]:
        self.encoder.eval()
        out: list[Mapping[str, float]] = []
        for i in range(0, len(feats), batch_size):
            texts = [f.user_text for f in feats[i:i + batch_size]]
            q = torch.sigmoid(self.head(self.encoder(texts))).numpy()
            out += [dict(zip(self.model_list, map(float, row))) for row in q]
        return out

    async def confidence(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return self.predict([from_request(r) for r in reqs])

    # ---- training ----

    @classmethod
    def train(cls, table: PromptTable, settings: SemanticSettings,
              progress: bool = True) -> SemanticRouter:
        torch.manual_seed(settings.seed)
        rng = random.Random(settings.seed)
        encoder = Encoder(resolve_encoder(settings.encoder), settings.pooling,
                          normalize=False, max_length=settings.max_length)
        head = torch.nn.Linear(encoder.dim, len(table.models))
        with torch.no_grad():  # start at each model's base rate
            head.bias.copy_(torch.tensor(logit(np.nan_to_num(base_rates(table.correct),
                                                               nan=0.5))))
        params = list(encoder.parameters()) + list(head.parameters())
        opt = torch.optim.AdamW(params, lr=settings.lr)
        order = list(range(len(table.features)))
        labels = torch.tensor(table.correct, dtype=torch.float32)
        steps = settings.epochs * -(-len(order) // settings.batch_size)
        bar = tqdm(total=steps, desc="semantic router", disable=not progress, unit="batch")
        encoder.train()
        for _ in range(settings.epochs):
            rng.shuffle(order)
            for i in range(0, len(order), settings.batch_size):
                idx = order[i:i + settings.batch_size]
                loss = masked_bce(head(encoder([table.features[j].user_text for j in idx])),
                                  labels[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.close()
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
            data=data, libraries=library_versions(["torch", "transformers"])))

    @classmethod
    def load(cls, folder: str | Path, expected: Mapping[str, Any] | None = None
             ) -> SemanticRouter:
        path = Path(folder)
        meta = read_metadata(path, cls.KIND, expected)
        f = meta.feature_settings
        settings = SemanticSettings(**f, **meta.train_settings)
        encoder = Encoder(path / "encoder", f["pooling"], normalize=False,
                          max_length=f["max_length"])
        head = torch.nn.Linear(encoder.dim, len(meta.models))
        head.load_state_dict(torch.load(path / "head.pt", weights_only=True))
        return cls(encoder, head, meta.models, settings, meta)

