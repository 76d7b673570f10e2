"""``lmetric``: LMETRIC (section 5) over every candidate: the ``lmetric`` engine picker
(``router.policies.pickers.lmetric``: score_i = prefill_i x b_i, lowest wins, and the
two-phase hotspot detector), whose settings are this policy's table."""

from __future__ import annotations

from typing import Any, Sequence

from router.policies.base import PickerPolicy, decision
from router.policies.pickers.lmetric import LMetricSettings
from router.state.view import EngineView, StateView
from router.types import Decision, RoutingRequest


class LMetric(PickerPolicy[LMetricSettings]):
    name = "lmetric"
    Settings = LMetricSettings
    default_picker = "lmetric"

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        pick = self.picker.pick(req, cands, view)
        return decision(req, pick.engine, self.name, info=pick.info)
