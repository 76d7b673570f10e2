"""``vllm``: vLLM's data-parallel load balancer (baseline).

vLLM's ``DPLBAsyncMPClient`` sends each request to the engine with the lowest
``4 x waiting + running``, counting the requests it sent since the engine's last stats
as waiting; ties go to the first engine.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import Policy, decision
from router.settings import STRICT
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest

WAITING_WEIGHT = 4
"""vLLM's constant (not a setting there either)."""


@pydantic_dataclass(frozen=True, config=STRICT)
class VllmSettings:
    """No settings."""


def vllm_score(waiting: int, running: int) -> int:
    """score = 4 x waiting + running (lower is better)."""
    return WAITING_WEIGHT * waiting + running


def least_loaded(engines: Sequence[EngineView]) -> EngineView:
    """The engine of lowest ``vllm_score``; ties go to the first (as vLLM's)."""
    return min(engines, key=lambda e: vllm_score(e.waiting, e.batch_size))


class VllmBalancer(Policy[VllmSettings]):
    name = "vllm"
    Settings = VllmSettings
    inputs = frozenset({"waiting", "batch_size"})
    uses_prompt = False

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        return decision(req, least_loaded(cands), self.name)
