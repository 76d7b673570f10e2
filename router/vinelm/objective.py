"""Request objectives (VineLM section 4), carried in the workflow metadata.

- ``{"kind": "min_cost", "min_accuracy": a}``: minimise expected cost subject to
  accuracy >= a (optionally also ``max_latency_s``);
- ``{"kind": "max_accuracy", "max_cost": c, "max_latency_s": l}``: maximise accuracy
  subject to cost <= c and/or latency <= l (at least one of the two).

Header form (``X-Hetserve-Objective``): ``max_accuracy,max_cost=2,max_latency_s=30``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KINDS = ("min_cost", "max_accuracy")
_FIELDS = ("kind", "min_accuracy", "max_cost", "max_latency_s")


MAX_NUMBER = 1e15
"""Largest number a client's objective, budget or weight may hold."""


class ObjectiveError(ValueError):
    """A bad objective; ``param`` names the field (``workflow.objective.<field>``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


@dataclass(frozen=True)
class Objective:
    kind: str
    min_accuracy: float | None = None
    max_cost: float | None = None
    max_latency_s: float | None = None


def parse_objective(value: Any, param: str = "workflow.objective") -> Objective:
    """Validate a JSON objective object; ObjectiveError naming the field."""
    if not isinstance(value, dict):
        raise ObjectiveError(param, f"'{param}' must be an object with a 'kind' ("
                             + " or ".join(KINDS) + ")")
    for k in value:
        if k not in _FIELDS:
            raise ObjectiveError(f"{param}.{k}", f"unknown field '{param}.{k}'; expected one "
                                 "of " + ", ".join(_FIELDS))
    kind = value.get("kind")
    if kind not in KINDS:
        raise ObjectiveError(f"{param}.kind", f"'{param}.kind' must be one of "
                             + ", ".join(KINDS) + f", got {kind!r}")
    nums = {k: _number(value[k], f"{param}.{k}") for k in _FIELDS[1:] if value.get(k) is not None}
    if kind == "min_cost":
        if "min_accuracy" not in nums:
            raise ObjectiveError(f"{param}.min_accuracy", f"'{param}.min_accuracy' is "
                                 "required for kind min_cost")
        if nums["min_accuracy"] > 1:
            raise ObjectiveError(f"{param}.min_accuracy", f"'{param}.min_accuracy' must be "
                                 f"in [0, 1], got {nums['min_accuracy']}")
        if "max_cost" in nums:
            raise ObjectiveError(f"{param}.max_cost", f"'{param}.max_cost' is not allowed "
                                 "with kind min_cost (cost is what it minimises)")
    else:
        if "min_accuracy" in nums:
            raise ObjectiveError(f"{param}.min_accuracy", f"'{param}.min_accuracy' is not "
                                 "allowed with kind max_accuracy")
        if "max_cost" not in nums and "max_latency_s" not in nums:
            raise ObjectiveError(param, f"'{param}' with kind max_accuracy needs max_cost "
                                 "and/or max_latency_s")
    if nums.get("max_latency_s") == 0:
        raise ObjectiveError(f"{param}.max_latency_s", f"'{param}.max_latency_s' must be > 0")
    return Objective(kind, **nums)


def objective_from_header(raw: str) -> dict[str, Any]:
    """``kind,key=value,...`` as the JSON object ``parse_objective`` checks (values that
    are not numbers stay strings, for the validator to report)."""
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    out: dict[str, Any] = {"kind": parts[0] if parts else ""}
    for item in parts[1:]:
        key, _, val = item.partition("=")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            out[key.strip()] = val
    return out


def _number(v: Any, param: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ObjectiveError(param, f"'{param}' must be a number, got {type(v).__name__}")
    if not 0 <= v <= MAX_NUMBER:  # also false for NaN; no float() of a huge int
        bound = ">= 0" if v < 0 else f"<= {MAX_NUMBER:g}"
        raise ObjectiveError(param, f"'{param}' must be a finite number {bound}, got "
                             f"{v if abs(v) < 1e40 else 'a huge number'}")
    return float(v)
