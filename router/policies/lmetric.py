"""``lmetric``: LMETRIC (section 5) over every candidate: the ``lmetric`` engine picker
(``router.policies.pickers.lmetric``: score_i = prefill_i x b_i, lowest wins, and the
two-phase hotspot detector), whose settings are this policy's table."""

from __future__ import annotations

from router.policies.base import PickerPolicy
from router.policies.pickers.lmetric import LMetricSettings


class LMetric(PickerPolicy[LMetricSettings]):
    name = "lmetric"
    Settings = LMetricSettings
    default_picker = "lmetric"
