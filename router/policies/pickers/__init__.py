"""Engine pickers: one module each, a registry by name (see ``registry``)."""

from router.policies.pickers.base import Pick, Picker
from router.policies.pickers.registry import PICKERS, PickerName

__all__ = ["PICKERS", "Pick", "Picker", "PickerName"]
