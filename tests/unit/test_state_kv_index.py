"""KV prefix index and vLLM-identical block hashing (no vLLM import)."""

from __future__ import annotations

from typing import Sequence

import pytest

from engine_ext.telemetry import AllBlocksCleared, BlockRemoved, BlockStored
from router.state.kv_hash import BlockHasher, cached_prefix_tokens, external_hash
from router.state.kv_index import KVPrefixIndex

TOKENS = list(range(1000, 1012))
# vLLM 0.32: hash_block_tokens(sha256, ...) chained from init_none_hash(sha256) without
# PYTHONHASHSEED, then maybe_convert_block_hash; block size 4.
VLLM_HASHES = [5160124834463444493, 881344537972422226, 16276992127602420729]


def stored(hashes: Sequence[int | bytes], medium: str | None = None,
           group_idx: int | None = None) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[],
                       block_size=4, medium=medium, group_idx=group_idx)


def removed(hashes: Sequence[int | bytes]) -> BlockRemoved:
    return BlockRemoved(block_hashes=list(hashes))


def test_hashes_equal_vllm_golden_values() -> None:
    assert BlockHasher().block_hashes(TOKENS, 4) == VLLM_HASHES


def test_only_full_blocks_are_hashed_and_chaining_depends_on_the_prefix() -> None:
    h = BlockHasher()
    assert h.block_hashes(TOKENS[:11], 4) == VLLM_HASHES[:2]
    assert h.block_hashes(TOKENS[:3], 4) == []
    other = h.block_hashes([0] + TOKENS[1:], 4)
    assert all(a != b for a, b in zip(other, VLLM_HASHES))  # a change in block 0 moves all


def test_seed_changes_every_hash_and_unknown_algo_is_rejected() -> None:
    assert BlockHasher(none_hash_seed="42").block_hashes(TOKENS, 4)[0] != VLLM_HASHES[0]
    with pytest.raises(ValueError, match="kv_hash_algo 'xxhash' is not supported"):
        BlockHasher("xxhash")


def test_external_hash_is_the_low_64_bits_of_the_digest() -> None:
    digest = bytes(range(32))
    assert external_hash(digest) == int.from_bytes(digest[-8:], "big")
    assert external_hash(7) == 7


@pytest.mark.parametrize("num_tokens,matched,expected", [
    (12, 3, 8),    # all blocks cached: the last token is recomputed, so one block less
    (13, 3, 12),   # 12 cached tokens, token 13 computed
    (12, 1, 4), (12, 0, 0), (4, 1, 0), (0, 0, 0)])
def test_cached_prefix_tokens_follow_vllm(num_tokens: int, matched: int, expected: int) -> None:
    assert cached_prefix_tokens(num_tokens, matched, 4) == expected


def test_add_match_remove_clear() -> None:
    idx = KVPrefixIndex()
    idx.apply(stored(VLLM_HASHES))
    assert idx.block_size == 4 and len(idx) == 3
    assert idx.match(VLLM_HASHES) == 3
    idx.apply(removed([VLLM_HASHES[1]]))
    assert idx.match(VLLM_HASHES) == 1  # a hit is contiguous from the first block
    idx.apply(AllBlocksCleared())
    assert idx.match(VLLM_HASHES) == 0 and len(idx) == 0


def test_duplicate_blocks_are_counted() -> None:
    idx = KVPrefixIndex()
    idx.apply(stored(VLLM_HASHES[:1]))
    idx.apply(stored(VLLM_HASHES[:1]))
    idx.apply(removed(VLLM_HASHES[:1]))
    assert VLLM_HASHES[0] in idx
    idx.apply(removed(VLLM_HASHES[:1]))
    assert VLLM_HASHES[0] not in idx
    idx.apply(removed(VLLM_HASHES[:1]))  # unknown removal: harmless
    assert len(idx) == 0


def test_bytes_hashes_are_indexed_in_external_form() -> None:
    idx = KVPrefixIndex()
    digest = bytes(range(32))
    idx.apply(stored([digest]))
    assert idx.match([external_hash(digest)]) == 1


def test_other_media_and_groups_are_ignored() -> None:
    idx = KVPrefixIndex()
    idx.apply(stored(VLLM_HASHES, medium="CPU"))
    idx.apply(stored(VLLM_HASHES, group_idx=1))
    assert len(idx) == 0
    idx.apply(stored(VLLM_HASHES, medium="GPU", group_idx=0))
    assert len(idx) == 3
