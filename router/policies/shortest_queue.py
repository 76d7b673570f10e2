"""``shortest_queue``: the candidate with the fewest running plus waiting requests."""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class ShortestQueueSettings:
    """No settings."""


class ShortestQueue(Policy[ShortestQueueSettings]):
    name = "shortest_queue"
    Settings = ShortestQueueSettings
    inputs = frozenset({"requests"})
    uses_prompt = False

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        return decision(req, min(cands, key=lambda e: e.requests), self.name)
