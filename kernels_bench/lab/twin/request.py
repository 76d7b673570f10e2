"""A request sent to an engine twin, and what happened to it."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_patches.contract import NO_PRIORITY, RetentionHint


@dataclass(frozen=True)
class TwinRequest:
    """One call as the engine receives it: real prompt token ids (prefix caching and block
    hashes are real), the forced output length (``max_tokens`` with ``ignore_eos``), the
    router's priority (``scheduler_patches.contract``; absent: ``NO_PRIORITY``) and its
    KV retention hint (``vllm_xargs``; absent: none)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_tokens: int
    priority: int = NO_PRIORITY
    retention: RetentionHint | None = None


@dataclass
class RequestRecord:
    """Per-request timestamps on the virtual clock (seconds)."""

    request_id: str
    engine: str
    prompt_tokens: int
    output_tokens: int
    priority: int
    arrival: float
    """When the engine received it."""
    first_scheduled: float | None = None
    """Start of the first step that computed any of its tokens."""
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache when first scheduled."""
    first_token: float | None = None
    """End of the step that sampled its first output token."""
    finish: float | None = None
    """End of the step that sampled its last output token."""
    generated: int = 0
    """Output tokens sampled so far."""

    @property
    def queue_s(self) -> float | None:
        """Engine queue time: arrival to first scheduling; None while not yet scheduled."""
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival
