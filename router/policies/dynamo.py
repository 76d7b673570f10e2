"""``dynamo``: NVIDIA Dynamo's KV-aware router cost (baseline).

cost_i = w x (Q_i + P - C_i) + D_i, lowest wins: the prefill tokens the engine would
have after routing here (its queued prefill Q_i plus the prompt P minus its cached
prefix C_i), weighted by Dynamo's ``overlap_score_weight`` w, plus its decode load D_i
(pending decode tokens). Dynamo counts blocks; dividing every term by the block size
does not change the argmin. Deterministic (router temperature 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from router.policies.base import Policy, check, decision
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@dataclass(frozen=True)
class DynamoSettings:
    overlap_score_weight: float = 1.0
    """w: Dynamo's default."""

    def __post_init__(self) -> None:
        check("overlap_score_weight", self.overlap_score_weight >= 0, "must be >= 0")


def dynamo_cost(queued_prefill: int, prompt: int, cached: int, decode_load: int,
                w: float) -> float:
    """w x (Q + P - C) + D."""
    return w * (queued_prefill + prompt - cached) + decode_load


class Dynamo(Policy[DynamoSettings]):
    name = "dynamo"
    Settings = DynamoSettings

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        w = self.settings.overlap_score_weight
        engine = min(cands, key=lambda e: dynamo_cost(
            e.prefill_tokens, req.num_prompt_tokens, view.cached_tokens(req, e.name),
            e.decode_tokens, w))
        return decision(req, engine, self.name)
