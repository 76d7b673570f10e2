"""``cascade``: every program starts on the cheapest model of a ladder and moves one rung up
each time its agent tries it again (FrugalGPT's LLM cascade, Chen, Zaharia and Zou 2023,
arXiv 2305.05176, section 3: query the models in order and stop at the first answer the
judge accepts).

Here the judge is the agent's own: it retries a program whose answer failed a check it
can run (a coding agent runs the examples its prompt states; ``--retry-on examples`` in
the replay), and the retry carries, per stage, the models already tried for it
(``workflow.tried_models``). A call goes to the first model of ``models`` not among them
(the last model once every rung was tried), within that model to the least-loaded
engine; when no engine of it can take the call, the least-loaded other engine does
(the ``picker`` setting's engine picker chooses, default ``least_loaded``). A
program whose agent says it has no check (``workflow.checked = false``: a prompt that
states no examples) goes to the last rung at once: nothing would catch a wrong cheap
answer (FrugalGPT's cascade stops only where its scorer accepts). It reads no prompt (nor
does its default picker) and no predictor: the quality signal is the check the agent ran
(issue 30, "the signal the workflow itself produces")."""

from __future__ import annotations

from typing import Annotated, Any, Sequence

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import PickerPolicy, decision
from router.policies.pickers import PickerName
from router.settings import STRICT
from router.state.view import EngineView, StateView
from router.types import ClusterInfo, Decision, RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class CascadeSettings:
    models: Annotated[list[Annotated[str, Field(max_length=256)]],
                      Field(max_length=64)] = Field(default_factory=list)
    """The ladder, cheapest first: served model names (no default: the policy refuses to
    start without two or more)."""
    picker: PickerName = "least_loaded"
    """The engine picker that chooses among the chosen model's engines
    (``router.policies.pickers``; docs/policies.md)."""


class Cascade(PickerPolicy[CascadeSettings]):
    name = "cascade"
    program_affinity = True
    Settings = CascadeSettings
    default_picker = "least_loaded"
    uses_prompt = False

    def __init__(self, settings: CascadeSettings, cluster: ClusterInfo, *args: Any) -> None:
        models = settings.models
        unknown = [m for m in models if m not in cluster.models]
        if len(models) < 2 or len(set(models)) < len(models) or unknown:
            raise ValueError(
                "router.policies.cascade.models must name two or more distinct served "
                f"models, cheapest first; got {models[:8]!r}"
                + (f" ({unknown[0]!r} is not served here)" if unknown else "")
                + f"; served models: {', '.join(cluster.models)}")
        super().__init__(settings, cluster, *args)

    def rung(self, req: RoutingRequest) -> str:
        """The model this call goes to: the first of the ladder not tried yet (the last
        when the agent has no check)."""
        ladder = self.settings.models
        if req.workflow.checked is False:
            return ladder[-1]
        tried = set(req.workflow.tried_models)
        return next((m for m in ladder if m not in tried), ladder[-1])

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        model = self.rung(req)
        mine = [e for e in cands if e.model == model] or list(cands)
        pick = self.picker.pick(req, mine, view)
        return decision(req, pick.engine, self.name, info=pick.info)
