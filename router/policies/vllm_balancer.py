"""``vllm``: vLLM's data-parallel load balancer (baseline): the ``least_loaded`` engine
picker (``router.policies.pickers.least_loaded``: lowest ``4 x waiting + running``) over
every candidate."""

from __future__ import annotations

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import PickerPolicy
from router.settings import STRICT


@pydantic_dataclass(frozen=True, config=STRICT)
class VllmSettings:
    """No settings."""


class VllmBalancer(PickerPolicy[VllmSettings]):
    name = "vllm"
    Settings = VllmSettings
    default_picker = "least_loaded"
    uses_prompt = False
