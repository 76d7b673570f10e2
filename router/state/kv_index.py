"""Per-engine KV prefix index, fed by vLLM's BlockStored / BlockRemoved / AllBlocksCleared."""

from __future__ import annotations

from typing import Sequence

from engine_ext.telemetry import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from router.state.kv_hash import external_hash

_INDEXED_MEDIA = (None, "GPU")
"""Blocks on other media (CPU offload tiers) are not prefix-cache hits for the engine."""


class KVPrefixIndex:
    """The block hashes one engine holds in its prefix cache.

    A hash is counted, not just present: vLLM may hold two blocks with the same hash and
    removes them one event at a time. Only KV cache group 0 (full attention) is indexed.
    """

    def __init__(self) -> None:
        self._blocks: dict[int, int] = {}
        self.block_size: int | None = None
        """Block size of the engine, learned from its BlockStored events."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, AllBlocksCleared):
            self.clear()
        elif event.medium not in _INDEXED_MEDIA or event.group_idx not in (None, 0):
            return
        elif isinstance(event, BlockStored):
            self.block_size = event.block_size
            for h in event.block_hashes:
                key = external_hash(h)
                self._blocks[key] = self._blocks.get(key, 0) + 1
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                key = external_hash(h)
                left = self._blocks.get(key, 0) - 1
                if left > 0:
                    self._blocks[key] = left
                else:
                    self._blocks.pop(key, None)

    def clear(self) -> None:
        self._blocks.clear()

    def match(self, block_hashes: Sequence[int]) -> int:
        """Number of leading ``block_hashes`` present (a prefix cache hit is contiguous)."""
        n = 0
        for h in block_hashes:
            if h not in self._blocks:
                break
            n += 1
        return n
