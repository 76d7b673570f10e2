"""``filter``: AIBrix's prefix-cache router (baseline).

If the spread of running plus waiting requests over the candidates exceeds
``imbalance_range`` (max b - min b > range), balance load: the least loaded candidate.
Otherwise the candidate with the longest cached prefix of the prompt, ties to the
least loaded.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT, Count
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class FilterSettings:
    imbalance_range: Count = 8
    """AIBrix's absolute running-request imbalance count that switches to balancing."""


def imbalanced(loads: Sequence[int], imbalance_range: int) -> bool:
    """max b - min b > range."""
    return max(loads) - min(loads) > imbalance_range


class PrefixFilter(Policy[FilterSettings]):
    name = "filter"
    Settings = FilterSettings
    inputs = frozenset({"requests", "cached_tokens"})

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        if imbalanced([e.requests for e in cands], self.settings.imbalance_range):
            engine = min(cands, key=lambda e: e.requests)
            return decision(req, engine, self.name, info={"mode": "balance"})
        engine = min(cands, key=lambda e: (-view.cached_tokens(req, e.name), e.requests))
        return decision(req, engine, self.name, info={"mode": "prefix"})
