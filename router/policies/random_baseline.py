"""``random``: a uniformly random candidate from a seeded generator (baseline)."""

from __future__ import annotations

import random
from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT, Count
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class RandomSettings:
    seed: Count = 0
    """Seed of the policy's own generator: runs are reproducible."""


class RandomPolicy(Policy[RandomSettings]):
    name = "random"
    Settings = RandomSettings
    uses_prompt = False

    def __init__(self, settings: RandomSettings, *args: Any) -> None:
        super().__init__(settings, *args)
        self._rng = random.Random(settings.seed)

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        return decision(req, self._rng.choice(cands), self.name)
