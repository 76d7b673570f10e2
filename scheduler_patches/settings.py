"""Engine scheduler settings carried into the EngineCore process.

``engine_ext.serve`` puts them under the ``"hetserve"`` key of vLLM's
``--additional-config`` JSON; the schedulers read them back with ``hetserve_config``.
Each concern's settings are a pydantic dataclass with ``config=STRICT`` (the router's
style, ``router.settings``): a bound lives in the field's type, and ``from_table`` builds
one from the keys of the table it knows. They are read once, when a scheduler starts.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar, get_args

from pydantic import ConfigDict, ValidationError

EnginePolicy = Literal["stjf", "fcfs", "priority", "mlfq"]
ENGINE_POLICIES = get_args(EnginePolicy)
"""Engine scheduler policies: ours (stjf, mlfq) and vLLM's own (fcfs, priority)."""

STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
"""Values keep their JSON type (an integer is taken for a number), no unknown key."""

T = TypeVar("T")


def vllm_scheduling_policy(policy: str) -> str:
    """vLLM's ``--scheduling-policy`` for an engine policy: ``fcfs`` for fcfs, else
    ``priority`` (the request's ``priority`` field reaches our schedulers)."""
    return "fcfs" if policy == "fcfs" else "priority"


def hetserve_config(vllm_config: Any) -> dict[str, Any]:
    """The ``hetserve`` table of ``vllm_config.additional_config`` (empty if absent)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    table = extra.get("hetserve", {}) if isinstance(extra, dict) else {}
    if not isinstance(table, dict):
        raise ValueError("additional_config.hetserve must be a JSON object")
    return table


def from_table(cls: type[T], table: dict[str, Any]) -> T:
    """Settings ``cls`` from the keys of a ``hetserve`` table it has (the others are
    another concern's); ValueError ``additional_config.hetserve.<key>: <problem>``."""
    fields = cls.__pydantic_fields__  # type: ignore[attr-defined]
    try:
        return cls(**{k: v for k, v in table.items() if k in fields})
    except ValidationError as exc:
        e = exc.errors()[0]
        key = ".".join(str(part) for part in e["loc"])
        raise ValueError(f"additional_config.hetserve.{key}: {e['msg']}, "
                         f"got {e['input']!r}") from None
