"""Engine pickers by name, and ``PickerName``: the type of a policy's ``picker`` setting.

Adding a picker: its module in this package, and its line in ``PICKERS`` (docs/policies.md,
"Add an engine picker")."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from router.policies.pickers.base import Picker
from router.policies.pickers.least_kv import LeastKv
from router.policies.pickers.least_loaded import LeastLoaded
from router.policies.pickers.lmetric import LMetricPicker
from router.settings import suggest

PICKERS: dict[str, type[Picker]] = {p.name: p for p in (
    LMetricPicker,
    LeastLoaded,
    LeastKv,
)}


def _known(name: str) -> str:
    if name not in PICKERS:
        raise ValueError(f"unknown picker {name[:80]!r}{suggest(name, PICKERS)}; known "
                         f"pickers: {', '.join(PICKERS)}")
    return name


PickerName = Annotated[str, AfterValidator(_known)]
"""A policy's ``picker`` setting: a name in ``PICKERS``, checked when the table loads."""
