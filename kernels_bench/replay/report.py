"""The summary tables of a replay: absolute values and ratios against the baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels_bench.replay.metrics import lookup, ratio


@dataclass(frozen=True)
class Column:
    key: str
    """Dotted key into a run's summary (``metrics.summarize``)."""
    name: str
    unit: str = ""
    scale: float = 1.0
    """Shown value = stored value x scale (seconds -> ms)."""
    in_ratios: bool = True

    @property
    def header(self) -> str:
        return f"{self.name} {self.unit}".strip()


COLUMNS = (
    Column("e2e_s.mean", "E2E mean", "s"),
    Column("e2e_s.p50", "E2E p50", "s"),
    Column("e2e_s.p95", "E2E p95", "s"),
    Column("e2e_s.p99", "E2E p99", "s"),
    Column("e2e_per_token_s.mean", "E2E/token", "ms", 1e3),
    Column("makespan_s", "makespan", "s"),
    Column("queue_s.mean", "queue mean", "s"),
    Column("ttft_s.mean", "TTFT mean", "s"),
    Column("tpot_s.mean", "TPOT mean", "ms", 1e3),
    Column("score", "score"),
    Column("ttca_s.mean", "TTCA mean", "s"),
    Column("solved", "solved"),
    Column("kv_hit_rate", "KV hit", in_ratios=False),
)


def baseline_run(summary: Mapping[str, Any], rate: float) -> Mapping[str, Any] | None:
    """The baseline policy's run at ``rate``, if it was run."""
    base = summary["meta"]["baseline"]
    for run in summary["runs"]:
        if run["policy"] == base and run["rate"] == rate:
            return run
    return None


def _num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"


def traffic_text(run: Mapping[str, Any]) -> str:
    """``tiny-a 62% / tiny-b 38%`` (share of calls)."""
    t = run["summary"]["traffic"]
    return " / ".join(f"{m} {100 * v['calls']:.0f}%" for m, v in t.items()) or "-"


def _rows_in_order(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Runs by rate, then in the order the policies were given."""
    order = {p["label"]: i for i, p in enumerate(summary["meta"]["policies"])}
    return sorted(summary["runs"], key=lambda r: (r["rate"], order.get(r["policy"], 1 << 30)))


def markdown_tables(summary: Mapping[str, Any]) -> str:
    """The absolute table, then the ratio table (value / baseline at the same rate)."""
    runs = _rows_in_order(summary)
    head = ["policy", "rate/s", *(c.header for c in COLUMNS), "traffic (calls)", "errors",
            "engine downs"]
    lines = [_md_row(head), _md_row(["---"] * len(head))]
    for run in runs:
        s = run["summary"]
        cells = [_num(_scaled(s, c)) for c in COLUMNS]
        lines.append(_md_row([run["policy"], f"{run['rate']:g}", *cells, traffic_text(run),
                              str(s["errors"]), _downs_text(run)]))
    base = summary["meta"]["baseline"]
    cols = [c for c in COLUMNS if c.in_ratios]
    out = "\n".join(lines)
    if not any(baseline_run(summary, r["rate"]) for r in runs):
        return out + f"\n\n(no ratios: the baseline {base!r} was not run)"
    head = ["policy", "rate/s", *(c.name for c in cols)]
    ratio_lines = [_md_row(head), _md_row(["---"] * len(head))]
    for run in runs:
        b = baseline_run(summary, run["rate"])
        if b is None:
            continue
        cells = [_ratio_text(lookup(run["summary"], c.key), lookup(b["summary"], c.key))
                 for c in cols]
        ratio_lines.append(_md_row([run["policy"], f"{run['rate']:g}", *cells]))
    return (out + f"\n\nRatios against `{base}` at the same rate (lower is better for "
            "latencies, higher for score and solved):\n\n" + "\n".join(ratio_lines))


def _downs_text(run: Mapping[str, Any]) -> str:
    """Engine-down events of the kept run, and how many runs it took (``0 (2 runs)``)."""
    downs, tries = run["summary"].get("engine_down_events", 0), run.get("run_attempts", 1)
    return f"{downs}" + (f" ({tries} runs)" if tries > 1 else "")


def _ratio_text(value: float | None, base: float | None) -> str:
    r = ratio(value, base)
    return "-" if r is None else f"{r:.2f}x"


def _scaled(s: Mapping[str, Any], c: Column) -> float | None:
    v = lookup(s, c.key)
    return None if v is None else v * c.scale


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def flat_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One CSV row per run: metrics in stored units, ratios, traffic shares."""
    rows = []
    for run in _rows_in_order(summary):
        s, b = run["summary"], baseline_run(summary, run["rate"])
        row: dict[str, Any] = {"policy": run["policy"], "rate": run["rate"],
                               "workflows": s["workflows"], "errors": s["errors"],
                               "engine_down_events": s.get("engine_down_events", 0)}
        for c in COLUMNS:
            row[c.key] = lookup(s, c.key)
        for c in COLUMNS:
            if c.in_ratios:
                row[f"{c.key}/baseline"] = (None if b is None else
                                            ratio(lookup(s, c.key), lookup(b["summary"], c.key)))
        for m, share in s["traffic"].items():
            row[f"traffic.{m}.calls"] = share["calls"]
            row[f"traffic.{m}.tokens"] = share["tokens"]
        rows.append(row)
    return rows


def _pct_change(value: float | None, base: float | None) -> str | None:
    r = ratio(value, base)
    return None if r is None else f"{100 * (r - 1):+.0f}%"


PAIRS = (
    ("chimera:stjf", "chimera:fcfs", "STJF against FCFS engines, both routed by Chimera"),
    ("oracle", "chimera:stjf", "true remaining lengths (oracle) against predicted ones"),
    ("chimera:stjf", "vllm:fcfs", "Chimera (routing + STJF) against the vLLM baseline"),
)
"""Comparisons the results page spells out when both policies were run."""


def observations(summary: Mapping[str, Any]) -> list[str]:
    """Measured differences of the policy pairs in ``PAIRS`` and the fastest policy,
    per rate (facts only)."""
    by = {(r["policy"], r["rate"]): r["summary"] for r in summary["runs"]}
    out = []
    for rate in summary["meta"]["rates"]:
        for a, b, what in PAIRS:
            sa, sb = by.get((a, rate)), by.get((b, rate))
            if sa is None or sb is None:
                continue
            parts = []
            for key, name in (("queue_s.mean", "mean queueing"), ("e2e_s.mean", "mean E2E"),
                              ("e2e_s.p95", "p95 E2E"),
                              ("e2e_per_token_s.mean", "E2E per token"),
                              ("score", "score")):
                change = _pct_change(lookup(sa, key), lookup(sb, key))
                if change is not None:
                    parts.append(f"{name} {change}")
            if parts:
                out.append(f"At {rate:g} workflows/s, `{a}` vs `{b}` ({what}): "
                           + ", ".join(parts) + ".")
        runs = [(p, s) for (p, r), s in by.items() if r == rate and s["e2e_s"]["mean"]]
        if runs:
            best = min(runs, key=lambda ps: ps[1]["e2e_s"]["mean"])
            top = max(s["score"] or 0.0 for _, s in runs)
            tied = [p for p, s in runs if (s["score"] or 0.0) == top]
            scored = (f"every policy scored {top:.3g}" if len(tied) == len(runs) else
                      "the highest score is " + ", ".join(f"`{p}`" for p in tied)
                      + f" ({top:.3g})")
            out.append(f"At {rate:g} workflows/s the lowest mean E2E is `{best[0]}` "
                       f"({best[1]['e2e_s']['mean']:.3g} s); {scored}.")
    return out
