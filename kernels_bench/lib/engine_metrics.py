"""Engine-side counters of a run, from each engine's Prometheus ``/metrics`` (vLLM's own).

A run's value is the difference between a scrape after and one before it, summed over
the engines: prefix cache queries and hits (tokens), queue time (sum and count of vLLM's
histogram: from arrival at the engine's scheduler to first scheduling; its buckets start
at 0.3 s, too coarse for quantiles here, so only the mean is used), preemptions, prompt
and generated tokens. And from the router's ``/metrics``: how often it marked an engine
down during the run (a run with such events did not compare policies on the whole
cluster), and its routing decisions' latency histogram (``Decisions``). Also each engine's
KV cache settings (vLLM's ``cache_config_info``: block size, KV tokens).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.state.stats import LATENCY_BUCKETS_S

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


def cache_config(client: httpx.Client, base_url: str) -> dict[str, str]:
    """The labels of the engine's ``vllm:cache_config_info`` (``block_size``,
    ``num_gpu_blocks``, ...; values as vLLM writes them, "None" included); {} without it."""
    for family in text_string_to_metric_families(_get(client, f"{base_url}/metrics")):
        if family.name == "vllm:cache_config_info":
            for s in family.samples:
                return dict(s.labels)
    return {}


def block_size(labels: dict[str, str]) -> int | None:
    """The KV block size in tokens of ``cache_config`` labels; None when absent."""
    size = labels.get("block_size", "None")
    return int(size) if size.isdigit() and int(size) > 0 else None


def _get(client: httpx.Client, url: str) -> str:
    """The body of ``url``; RuntimeError naming it when it does not answer."""
    try:
        r = client.get(url, timeout=10.0)
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise RuntimeError(f"cannot read {url}: {e}") from None
    return r.text


DECISION_HISTOGRAM = "hetserve_decision_latency_seconds"


@dataclass(frozen=True)
class Decisions:
    """The router's decision latency histogram (``route()`` entry to decision, predictors
    included): total seconds, count, and the cumulative count at each bucket bound."""

    sum_s: float = 0.0
    count: float = 0.0
    cumulative: tuple[tuple[float, float], ...] = ()
    """(upper bound in seconds, decisions at most that long), bounds ascending, +inf last."""

    @classmethod
    def of(cls, seconds: Sequence[float],
           bounds: Sequence[float] = LATENCY_BUCKETS_S) -> Decisions:
        """The histogram the router would export for these decision times (the twin's)."""
        ordered = sorted(seconds)
        return cls(float(sum(ordered)), float(len(ordered)), tuple(
            (float(b), float(bisect.bisect_right(ordered, b)))
            for b in (*bounds, float("inf"))))

    def summary(self) -> dict[str, float | None]:
        """A run's ``router`` figures: mean, p50 and p99 (``quantile``) in seconds, and the
        share of decisions within 1 ms (``at_most``, exact)."""
        return {"decision_s_mean": self.mean_s, "decision_s_p50": self.quantile(0.5),
                "decision_s_p99": self.quantile(0.99),
                "decisions_within_1ms": self.at_most(1e-3)}

    def __sub__(self, other: Decisions) -> Decisions:
        before = dict(other.cumulative)
        return Decisions(self.sum_s - other.sum_s, self.count - other.count,
                         tuple((b, c - before.get(b, 0.0)) for b, c in self.cumulative))

    @property
    def mean_s(self) -> float | None:
        return self.sum_s / self.count if self.count else None

    def at_most(self, bound_s: float) -> float | None:
        """The share of decisions that took at most ``bound_s``: exact where ``bound_s`` is a
        bucket bound (the router's are in ``router.state.stats.LATENCY_BUCKETS_S``: 1 ms and
        5 ms among them), else that of the largest bound below it."""
        if not self.count:
            return None
        below = [c for b, c in self.cumulative if b <= bound_s]
        return (below[-1] if below else 0.0) / self.count

    def quantile(self, q: float) -> float | None:
        """Prometheus's ``histogram_quantile``: linear within the bucket that holds rank
        ``q * count`` (from 0 for the first bucket); the largest finite bound when that
        bucket is the last, unbounded one."""
        if not self.count:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for bound, cum in self.cumulative:
            if cum >= rank and cum > below:
                if bound == float("inf"):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cum - below)
            lower, below = (bound if bound != float("inf") else lower), cum
        return lower


def router_decisions(client: httpx.Client, router_url: str) -> Decisions:
    """The router's routing decisions since it started (every policy label summed)."""
    text = _get(client, f"{router_url}/metrics")
    total, count, cum = 0.0, 0.0, defaultdict(float)
    for f in text_string_to_metric_families(text):
        if f.name == DECISION_HISTOGRAM:
            for s in f.samples:
                if s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_bucket"):
                    cum[float(s.labels["le"])] += s.value
    return Decisions(total, count, tuple(sorted(cum.items())))


def router_down_events(client: httpx.Client, router_url: str) -> float:
    """Times the router has marked an engine down since it started."""
    text = _get(client, f"{router_url}/metrics")
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == ROUTER_DOWN_EVENTS for s in f.samples if s.name.endswith("_total"))
