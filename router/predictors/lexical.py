"""A lexical encoder for the KNN (``knn.encoder = "lexical"``): a prompt's words as they
are written, not their meaning.

The text, lower-cased and cut at ``max_length`` x ``CHARS_PER_TOKEN`` characters, has its
numbers replaced by ``0``; its word 1- and 2-grams (scikit-learn's ``HashingVectorizer``
tokens: words of two characters or more, so the masked numbers drop out and the 2-grams
span them) are hashed into ``DIMS`` buckets; each bucket weighs 1 + log(count) times its
inverse document frequency log((1 + n) / (1 + df)) + 1 over the n training prompts (the
one thing fitted, saved with the artifact); the vector is L2-normalised. Prompts made
from one template with other names and numbers, as the math suite's are, then lie far
closer to each other than to any other template's (docs/research/predictors/quality/latency-plan.md,
"A lexical KNN"). Stateless hashing: no vocabulary to ship, the same buckets in every
process.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from scipy import sparse

LEXICAL = "lexical"
"""The ``knn.encoder`` spec of this encoder."""
DIMS = 4096
"""Hash buckets (the vector's dimensions)."""
NGRAMS = (1, 2)
CHARS_PER_TOKEN = 16
"""As ``StaticEncoder``'s: text past ``max_length`` x this many characters is cut."""
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
FILE = "lexical.json"


def masked(text: str) -> str:
    """Lower case, every number replaced by ``0``."""
    return NUMBER.sub("0", text.lower())


def is_lexical(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a saved ``LexicalEncoder``."""
    return (Path(folder) / FILE).is_file()


class LexicalEncoder:
    """Same ``embed`` / ``dim`` / ``save`` as the sentence encoders
    (``router.predictors.encoder``)."""

    def __init__(self, idf: np.ndarray, max_length: int = 256) -> None:
        if idf.shape != (DIMS,) or not np.isfinite(idf).all():
            raise ValueError(f"lexical encoder: {DIMS} finite inverse document frequencies "
                             f"expected, got shape {idf.shape}")
        from sklearn.feature_extraction.text import HashingVectorizer  # 0.6 s: on use

        self.idf, self.max_length = idf.astype(np.float64), max_length
        self.hasher = HashingVectorizer(ngram_range=NGRAMS, n_features=DIMS,
                                        alternate_sign=False, norm=None, lowercase=False)

    @property
    def dim(self) -> int:
        return DIMS

    def counts(self, texts: Sequence[str]) -> sparse.csr_matrix:
        """Per text, 1 + log(count) of each bucket it fills."""
        cut = self.max_length * CHARS_PER_TOKEN
        x = self.hasher.transform([masked(t[:cut]) for t in texts]).tocsr()
        x.sum_duplicates()
        x.data = 1.0 + np.log(x.data)
        return x

    def embed(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False
              ) -> np.ndarray:
        """float32 embeddings, one row per text (zeros for a text with no word); dense a
        ``batch_size`` of rows at a time."""
        out = np.zeros((len(texts), DIMS), np.float32)
        for i in range(0, len(texts), batch_size):
            x = self.counts(texts[i:i + batch_size])
            x.data *= self.idf[x.indices]  # in place: a broadcast multiply costs 5x the rest
            d = x.toarray()
            out[i:i + len(d)] = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)
        return out

    @classmethod
    def fit(cls, texts: Sequence[str], max_length: int = 256) -> LexicalEncoder:
        """The inverse document frequencies of ``texts`` (the training prompts)."""
        unit = cls(np.ones(DIMS), max_length)
        df = np.bincount(unit.counts(texts).indices, minlength=DIMS)
        return cls(np.log((1 + len(texts)) / (1 + df)) + 1, max_length)

    def save(self, folder: str | os.PathLike[str]) -> None:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / FILE).write_text(json.dumps({"dims": DIMS, "ngrams": list(NGRAMS),
                                             "idf": self.idf.tolist()}))

    @classmethod
    def load(cls, folder: str | os.PathLike[str], max_length: int = 256) -> LexicalEncoder:
        """ValueError when the file is not one this version writes."""
        try:
            meta = json.loads((Path(folder) / FILE).read_text())
            ok = meta["dims"] == DIMS and meta["ngrams"] == list(NGRAMS)
            idf = np.asarray(meta["idf"], dtype=np.float64)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"lexical encoder in {folder}: unreadable ({e})") from None
        if not ok:
            raise ValueError(f"lexical encoder in {folder}: saved with {meta['dims']} "
                             f"dimensions and n-grams {meta['ngrams']}, this version uses "
                             f"{DIMS} and {list(NGRAMS)}")
        return cls(idf, max_length)
