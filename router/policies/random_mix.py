"""``random_mix``: each program goes to the big model with probability ``share``, and
within its model to the least-loaded engine (issue 30's routing baseline; the engine is
the ``picker`` setting's choice, default ``least_loaded``).

The choice is a seeded hash of the program id (of the request id for a call without one;
``records.seeded_uniform`` below ``share``),
so every stage of a program lands on the same model with no state kept; when no engine
of that model can take the call, the least-loaded other engine does (the picker chooses
among every candidate then). At a share s it
is the random router at s: a learned router's frontier point (score, share of calls on
the big model) is judged against the curve this policy draws over s.
"""

from __future__ import annotations

from typing import Annotated, Any, Sequence

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import PickerPolicy, decision
from router.policies.pickers import PickerName
from router.predictors.records import seeded_uniform
from router.settings import STRICT, Count
from router.state.view import EngineView, StateView
from router.types import ClusterInfo, Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class RandomMixSettings:
    big_model: Annotated[str, Field(max_length=256)] = ""
    """The served model name that ``share`` of the programs go to (no default: the policy
    refuses to start without one)."""
    share: Annotated[float, Field(ge=0.0, le=1.0)] = 0.3
    """Probability that a program goes to ``big_model``."""
    seed: Count = 0
    """Seed of the hash: runs are reproducible."""
    picker: PickerName = "least_loaded"
    """The engine picker that chooses among the chosen model's engines
    (``router.policies.pickers``; docs/policies.md)."""


class RandomMix(PickerPolicy[RandomMixSettings]):
    name = "random_mix"
    program_affinity = True
    Settings = RandomMixSettings
    default_picker = "least_loaded"
    uses_prompt = False

    def __init__(self, settings: RandomMixSettings, cluster: ClusterInfo, *args: Any) -> None:
        if settings.big_model not in cluster.models:  # "" included
            raise ValueError(f"router.policies.random_mix.big_model {settings.big_model!r} "
                             f"is not served here; served models: "
                             f"{', '.join(cluster.models)}")
        super().__init__(settings, cluster, *args)

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        s = self.settings
        key = req.workflow.program_id or req.request_id
        big = seeded_uniform(key, s.seed) < s.share
        mine = [e for e in cands if (e.model == s.big_model) == big] or list(cands)
        pick = self.picker.pick(req, mine, view)
        return decision(req, pick.engine, self.name, info=pick.info)
