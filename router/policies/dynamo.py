"""``dynamo``: NVIDIA Dynamo's KV-aware router cost (baseline).

cost_i = w x (Q_i + P - C_i) + D_i, lowest wins: the prefill tokens the engine would
have after routing here (its queued prefill Q_i plus the prompt P minus its cached
prefix C_i), weighted by Dynamo's ``overlap_score_weight`` w, plus its decode load D_i
(pending decode tokens). Dynamo counts blocks; dividing every term by the block size
does not change the argmin. Deterministic (router temperature 0).
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT, NonNegative
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class DynamoSettings:
    overlap_score_weight: NonNegative = 1.0
    """w: Dynamo's default."""


def dynamo_cost(queued_prefill: int, prompt: int, cached: int, decode_load: int,
                w: float) -> float:
    """w x (Q + P - C) + D."""
    return w * (queued_prefill + prompt - cached) + decode_load


class Dynamo(Policy[DynamoSettings]):
    name = "dynamo"
    Settings = DynamoSettings
    inputs = frozenset({"prefill_tokens", "decode_tokens", "cached_tokens"})

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        w = self.settings.overlap_score_weight
        engine = min(cands, key=lambda e: dynamo_cost(
            e.prefill_tokens, req.num_prompt_tokens, view.cached_tokens(req, e.name),
            e.decode_tokens, w))
        return decision(req, engine, self.name)
