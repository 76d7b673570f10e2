"""The engine state a policy reads, and where each input comes from on a stock vLLM engine.

A patched engine (``engine_ext.serve``) publishes scheduler snapshots and KV cache events:
every input is measured there (or is the router's own). A stock vLLM engine
(``kind = "vllm"``) is scraped from its Prometheus ``/metrics``, which exports request
counts and KV usage but no token sums: those are estimated from the router's in-flight
ledger, which counts only the router's own requests. Each policy declares what it reads
(``Policy.inputs``), and so does each engine picker (``Picker.inputs``);
tests/unit/test_policy_inputs.py checks the declarations against their source.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, get_args

from router.policies.base import Policy
from router.policies.pickers import PICKERS

Input = Literal[
    # EngineView fields and properties
    "batch_size", "num_waiting", "queued_prefill_tokens", "pending_decode_tokens",
    "kv_usage", "last_seen_age_s", "inflight_requests", "inflight_predicted_tokens",
    "unreported_requests", "unreported_prefill_tokens", "unreported_decode_tokens",
    "max_model_len", "waiting", "requests", "prefill_tokens", "decode_tokens",
    # StateView methods
    "matched_blocks", "cached_tokens", "prefix_hits", "prefix_class", "model_inflight_tokens",
    "program_model", "program_engine",
]
INPUTS: frozenset[str] = frozenset(get_args(Input))

Source = Literal["measured", "kv events", "estimated", "router"]
SOURCES: tuple[Source, ...] = get_args(Source)

ON_STOCK_VLLM: dict[str, Source] = {
    # /metrics (waiting and requests add the router's own unreported requests)
    "batch_size": "measured", "num_waiting": "measured", "kv_usage": "measured",
    "waiting": "measured", "requests": "measured",
    # vLLM's KV events, when the engine runs with --kv-events-config (else absent: no match)
    "matched_blocks": "kv events", "cached_tokens": "kv events", "prefix_hits": "kv events",
    "prefix_class": "kv events",
    # not exported by vLLM: estimated from the router's in-flight ledger
    "queued_prefill_tokens": "estimated", "pending_decode_tokens": "estimated",
    "prefill_tokens": "estimated", "decode_tokens": "estimated",
    # the router's own state, the same on both kinds of engine
    "inflight_requests": "router", "inflight_predicted_tokens": "router",
    "unreported_requests": "router", "unreported_prefill_tokens": "router",
    "unreported_decode_tokens": "router", "model_inflight_tokens": "router",
    "program_model": "router", "program_engine": "router", "last_seen_age_s": "router", "max_model_len": "router",
}
"""Where each input comes from on a stock vLLM engine (on a patched engine every input
but the router's own is measured)."""

COLUMNS: dict[Source, str] = {"measured": "measured", "kv events": "from KV events",
                              "estimated": "estimated on stock vLLM"}
"""Table columns; the router's own inputs are left out (the same on both kinds)."""


def policy_inputs(policy: type[Policy[Any]],
                  table: Mapping[str, Any] | None = None) -> frozenset[str]:
    """What ``policy`` reads under its settings ``table`` (default: its defaults): its own
    inputs and its engine picker's."""
    picker = (table or {}).get("picker", policy.default_picker)
    return policy.inputs | (PICKERS[picker].inputs if picker else frozenset())


def stock_inputs(inputs: frozenset[str]) -> dict[str, list[str]]:
    """``inputs`` by source on stock vLLM (every source, sorted)."""
    return {s: sorted(i for i in inputs if ON_STOCK_VLLM[i] == s) for s in SOURCES}


def inputs_table(reads: Mapping[str, frozenset[str]], part: str = "policy") -> str:
    """A markdown table: per ``part`` (policy or picker, by name), its inputs measured,
    from KV events and estimated on a stock vLLM engine."""
    lines = [f"| {part} | " + " | ".join(COLUMNS.values()) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for name in sorted(reads):
        by_source = stock_inputs(reads[name])
        cells = [", ".join(f"`{i}`" for i in by_source[s]) or "-" for s in COLUMNS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
