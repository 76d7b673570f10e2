"""Engine pickers by name, and ``PickerName``: the type of a policy's ``picker`` setting.

Adding a picker: its module in this package, and its line ``"name": "module:Class"`` in
``PICKERS`` (docs/policies.md, "Add an engine picker")."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from router.policies.parts import load
from router.policies.pickers.base import Picker
from router.settings import suggest

PICKERS: dict[str, type[Picker]] = load(__package__, Picker, {
    "lmetric": "lmetric:LMetricPicker",
    "least_loaded": "least_loaded:LeastLoaded",
    "least_kv": "least_kv:LeastKv",
})


def _known(name: str) -> str:
    if name not in PICKERS:
        raise ValueError(f"unknown picker {name[:80]!r}{suggest(name, PICKERS)}; known "
                         f"pickers: {', '.join(PICKERS)}")
    return name


PickerName = Annotated[str, AfterValidator(_known)]
"""A policy's ``picker`` setting: a name in ``PICKERS``, checked when the table loads."""
