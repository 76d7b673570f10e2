"""``vllm``: vLLM's data-parallel load balancer (baseline): the ``least_loaded`` engine
picker (``router.policies.pickers.least_loaded``: lowest ``4 x waiting + running``) over
every candidate."""

from __future__ import annotations

from typing import Any, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import PickerPolicy, decision
from router.settings import STRICT
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class VllmSettings:
    """No settings."""


class VllmBalancer(PickerPolicy[VllmSettings]):
    name = "vllm"
    Settings = VllmSettings
    default_picker = "least_loaded"
    uses_prompt = False

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        pick = self.picker.pick(req, cands, view)
        return decision(req, pick.engine, self.name, info=pick.info)
