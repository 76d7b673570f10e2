"""Prefix-cache block hashes computed exactly as vLLM 0.32 computes them, without vLLM.

vLLM (``vllm/v1/core/kv_cache_utils.py`` and ``vllm/utils/hashing.py``):

- ``hash_block_tokens(fn, parent, tokens, extra_keys)`` = ``fn((parent or NONE_HASH,
  tuple(tokens), extra_keys))``, chained over the full blocks of the prompt
  (``get_request_block_hasher``: only full blocks are hashed);
- the default ``prefix_caching_hash_algo`` is ``sha256``: SHA-256 of
  ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)``;
- ``init_none_hash``: ``NONE_HASH = fn(seed)`` with seed ``PYTHONHASHSEED`` of the engine
  process if set, else ``"vllm-none-hash"`` for cryptographic algorithms;
- KV events carry ``maybe_convert_block_hash(h)`` = the low 64 bits of the big-endian
  digest (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, default on).

Requests without LoRA, multimodal inputs, ``cache_salt`` or prompt embeddings have
``extra_keys = None``: the only case the router routes.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Sequence

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
SUPPORTED_ALGOS = ("sha256",)
_MASK64 = (1 << 64) - 1


def _sha256(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def external_hash(block_hash: bytes | int) -> int:
    """vLLM's ``maybe_convert_block_hash``: a digest's low 64 bits (ints pass through)."""
    if isinstance(block_hash, int):
        return block_hash & _MASK64
    return int.from_bytes(block_hash, "big") & _MASK64


class BlockHasher:
    """Chained block hashes of a token sequence, in the 64-bit form of vLLM's KV events."""

    def __init__(self, algo: str = "sha256", none_hash_seed: str | None = None) -> None:
        """``none_hash_seed``: the engines' ``PYTHONHASHSEED`` if they set one."""
        if algo not in SUPPORTED_ALGOS:
            raise ValueError(f"kv_hash_algo '{algo}' is not supported; use one of "
                             f"{', '.join(SUPPORTED_ALGOS)} (vLLM's default)")
        self.none_hash = _sha256(none_hash_seed if none_hash_seed is not None
                                 else DEFAULT_NONE_HASH_SEED)

    def block_hashes(self, token_ids: Sequence[int], block_size: int) -> list[int]:
        """External (64-bit) hashes of every full block of ``token_ids``."""
        out: list[int] = []
        parent = self.none_hash
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = _sha256((parent, tuple(token_ids[start:start + block_size]), None))
            out.append(external_hash(parent))
        return out


def cached_prefix_tokens(num_tokens: int, matched_blocks: int, block_size: int) -> int:
    """Tokens vLLM serves from its prefix cache given ``matched_blocks`` leading hits.

    ``KVCacheManager.get_computed_blocks`` caps the hit at ``num_tokens - 1`` (the last
    prompt token is always recomputed for its logits), rounded down to full blocks.
    """
    if num_tokens <= 0:
        return 0
    return min(matched_blocks, (num_tokens - 1) // block_size) * block_size
