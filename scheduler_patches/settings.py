"""Engine scheduler settings carried into the EngineCore process.

``engine_ext.serve`` puts them under the ``"hetserve"`` key of vLLM's
``--additional-config`` JSON; the schedulers read them back with ``hetserve_config``.
"""

from __future__ import annotations

from typing import Any

ENGINE_POLICIES = ("stjf", "fcfs", "priority", "mlfq")
"""Engine scheduler policies: ours (stjf, mlfq) and vLLM's own (fcfs, priority)."""


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
