"""``round_robin``: the candidates in turn (baseline)."""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class RoundRobinSettings:
    """No settings."""


class RoundRobin(Policy[RoundRobinSettings]):
    name = "round_robin"
    Settings = RoundRobinSettings
    uses_prompt = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._turn = 0

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        engine = cands[self._turn % len(cands)]
        self._turn += 1
        return decision(req, engine, self.name)
