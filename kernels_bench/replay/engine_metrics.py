"""Engine-side counters of a run, from each engine's Prometheus ``/metrics`` (vLLM's own).

A run's value is the difference between a scrape after and one before it, summed over
the engines: prefix cache queries and hits (tokens), queue time (sum and count of vLLM's
histogram: from arrival at the engine's scheduler to first scheduling; its buckets start
at 0.3 s, too coarse for quantiles here, so only the mean is used), preemptions, prompt
and generated tokens. And from the router's ``/metrics``: how often it marked an engine
down during the run (a run with such events did not compare policies on the whole
cluster).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "vllm:prefix_cache_queries": "prefix_queries",
    "vllm:prefix_cache_hits": "prefix_hits",
    "vllm:num_preemptions": "preemptions",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
}
"""vLLM counter family -> field of ``EngineCounters``."""
QUEUE_HISTOGRAM = "vllm:request_queue_time_seconds"
ROUTER_DOWN_EVENTS = "hetserve_engine_down_events"


@dataclass
class EngineCounters:
    """Cumulative counters of one engine, or differences and sums of them."""

    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    queue_sum_s: float = 0.0
    queue_count: float = 0.0

    def __sub__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                                 for f in fields(self)})

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                 for f in fields(self)})


def parse_counters(text: str) -> EngineCounters:
    """The counters of one engine's ``/metrics`` text (summed over label sets)."""
    c = EngineCounters()
    for family in text_string_to_metric_families(text):
        if family.name in COUNTERS:
            attr = COUNTERS[family.name]
            total = sum(s.value for s in family.samples if s.name.endswith("_total"))
            setattr(c, attr, getattr(c, attr) + total)
        elif family.name == QUEUE_HISTOGRAM:
            for s in family.samples:
                if s.name.endswith("_sum"):
                    c.queue_sum_s += s.value
                elif s.name.endswith("_count"):
                    c.queue_count += s.value
    return c


def total(counters: Iterable[EngineCounters]) -> EngineCounters:
    out = EngineCounters()
    for c in counters:
        out = out + c
    return out


def hit_rate(c: EngineCounters) -> float | None:
    """Prefix cache hit rate: hit tokens / queried tokens."""
    return c.prefix_hits / c.prefix_queries if c.prefix_queries > 0 else None


def mean_queue_s(c: EngineCounters) -> float | None:
    return c.queue_sum_s / c.queue_count if c.queue_count > 0 else None


def scrape(client: httpx.Client, base_url: str) -> EngineCounters:
    """One engine's counters now."""
    return parse_counters(_get(client, f"{base_url}/metrics"))


def _get(client: httpx.Client, url: str) -> str:
    """The body of ``url``; RuntimeError naming it when it does not answer."""
    try:
        r = client.get(url, timeout=10.0)
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise RuntimeError(f"cannot read {url}: {e}") from None
    return r.text


DECISION_HISTOGRAM = "hetserve_decision_latency_seconds"


def router_decisions(client: httpx.Client, router_url: str) -> tuple[float, float]:
    """(sum of seconds, count) of the router's routing decisions since it started: from a
    request's arrival in ``route()`` to its decision, predictors included."""
    text = _get(client, f"{router_url}/metrics")
    total, count = 0.0, 0.0
    for f in text_string_to_metric_families(text):
        if f.name == DECISION_HISTOGRAM:
            for s in f.samples:
                if s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
    return total, count


def router_down_events(client: httpx.Client, router_url: str) -> float:
    """Times the router has marked an engine down since it started."""
    text = _get(client, f"{router_url}/metrics")
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == ROUTER_DOWN_EVENTS for s in f.samples if s.name.endswith("_total"))
