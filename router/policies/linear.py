"""``linear``: a weighted sum of KV prefix hit ratio and normalised load (baseline).

score_i = w_kv x hit_i - w_load x b_i / max_j b_j, highest wins, where hit_i is the
fraction of the prompt cached on i and b_i its running plus waiting requests. This is
the linear combinator LMETRIC (section 2) argues needs per-workload tuning.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT, NonNegative
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class LinearSettings:
    kv_weight: NonNegative = 1.0
    """w_kv."""
    load_weight: NonNegative = 1.0
    """w_load."""


def linear_score(hit_ratio: float, load: int, max_load: int, w_kv: float,
                 w_load: float) -> float:
    """w_kv x hit - w_load x b / max b (the load term is 0 when every b is 0)."""
    return w_kv * hit_ratio - (w_load * load / max_load if max_load else 0.0)


class Linear(Policy[LinearSettings]):
    name = "linear"
    Settings = LinearSettings
    inputs = frozenset({"requests", "cached_tokens"})

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        s = self.settings
        max_load = max(e.requests for e in cands)
        prompt = max(req.num_prompt_tokens, 1)

        def key(e: EngineView) -> float:
            hit = view.cached_tokens(req, e.name) / prompt
            return -linear_score(hit, e.requests, max_load, s.kv_weight, s.load_weight)

        return decision(req, min(cands, key=key), self.name)
