"""``least_loaded``: vLLM's data-parallel load balancing.

vLLM's ``DPLBAsyncMPClient`` sends each request to the engine with the lowest
``4 x waiting + running``, counting the requests it sent since the engine's last stats
as waiting; ties go to the first engine (the candidates are in name order).
"""

from __future__ import annotations

from typing import Sequence

from router.policies.pickers.base import Pick, Picker
from router.state.view import EngineView, StateView
from router.types import RoutingRequest

WAITING_WEIGHT = 4
"""vLLM's constant (not a setting there either)."""


def vllm_score(waiting: int, running: int) -> int:
    """score = 4 x waiting + running (lower is better)."""
    return WAITING_WEIGHT * waiting + running


def least_loaded(engines: Sequence[EngineView]) -> EngineView:
    """The engine of lowest ``vllm_score``; ties go to the first (as vLLM's)."""
    return min(engines, key=lambda e: vllm_score(e.waiting, e.batch_size))


class LeastLoaded(Picker):
    name = "least_loaded"
    inputs = frozenset({"waiting", "batch_size"})

    def pick(self, req: RoutingRequest, cands: Sequence[EngineView],
             view: StateView) -> Pick:
        return Pick(least_loaded(cands), {})
