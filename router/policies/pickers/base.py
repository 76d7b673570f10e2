"""The engine-picker interface: one engine among the candidates a policy narrowed down.

A picker is the second half of a policy that chooses the model first (Chimera, LAAR,
VineLM, ``random_mix``, ``cascade``): given the request, the candidates of the chosen
model and the read-only ``StateView``, it returns one engine. Like a policy it never
writes router state and may keep private decision history (LMETRIC's hotspot counters),
which only its own picks update; each policy builds its own picker. It declares the engine
state it reads (``inputs``, ``router.policies.inputs.Input``), checked against its source
by tests/unit/test_policy_inputs.py and against the vocabulary when a policy builds it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping, NamedTuple, Sequence

from router.state.view import EngineView, StateView
from router.types import RoutingRequest


class Pick(NamedTuple):
    """A picker's answer: the engine, and what the decision's ``info`` should add."""

    engine: EngineView
    info: dict[str, Any]


class Picker(ABC):
    """Base of every engine picker (one module each, registered in ``registry``)."""

    name: ClassVar[str]
    inputs: ClassVar[frozenset[str]]
    """The ``EngineView`` fields and ``StateView`` methods it reads (``Input``)."""
    uses_prompt: ClassVar[bool] = False
    """Whether it reads the request's prompt (directly or through prefix matches)."""

    @classmethod
    def built(cls, tables: Mapping[str, Mapping[str, Any]]) -> Picker:
        """The picker from the cluster file's ``[router.policies.*]`` tables; one with
        settings reads its own table (ValueError naming the key that is wrong)."""
        return cls()

    @abstractmethod
    def pick(self, req: RoutingRequest, cands: Sequence[EngineView],
             view: StateView) -> Pick:
        """One of ``cands`` (non-empty, sorted by name; one model's, or several where the
        policy's chosen model has no candidate)."""
