"""The summary tables of a replay: absolute values and ratios against the baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels_bench.lab.replay import intervals
from kernels_bench.lab.replay.metrics import lookup, ratio


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
    Column("router.cpu_s", "router CPU", "s", in_ratios=False),
    Column("router.decision_s_mean", "decision", "ms", 1e3, in_ratios=False),
    Column("router.decision_s_p50", "decision p50", "ms", 1e3, in_ratios=False),
)


def baseline_run(summary: Mapping[str, Any], rate: float, repeat: int = 0, fold: int = 0
                 ) -> Mapping[str, Any] | None:
    """The baseline policy's run at ``rate`` in ``repeat`` and ``fold``, if it was run."""
    base = summary["meta"]["baseline"]
    for run in summary["runs"]:
        if (run["policy"] == base and run["rate"] == rate and run.get("repeat", 0) == repeat
                and run.get("fold", 0) == fold):
            return run
    return None


def _baseline_of(summary: Mapping[str, Any], run: Mapping[str, Any]
                 ) -> Mapping[str, Any] | None:
    """The baseline's run beside ``run`` (same rate, repeat and fold)."""
    return baseline_run(summary, run["rate"], run.get("repeat", 0), run.get("fold", 0))


def _num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"


def traffic_text(run: Mapping[str, Any]) -> str:
    """``tiny-a 62% / tiny-b 38%`` (share of calls)."""
    t = run["summary"]["traffic"]
    return " / ".join(f"{m} {100 * v['calls']:.0f}%" for m, v in t.items()) or "-"


def _rows_in_order(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Runs by rate, then in the order the policies were given, then by repeat and fold."""
    order = {p["label"]: i for i, p in enumerate(summary["meta"]["policies"])}
    return sorted(summary["runs"], key=lambda r: (r["rate"], order.get(r["policy"], 1 << 30),
                                                  r.get("repeat", 0), r.get("fold", 0)))


def _label(run: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """The policy, with the repeat (``#2``) and fold (``f3``) when there are several."""
    m = summary["meta"]
    return (run["policy"] + (f" #{run.get('repeat', 0) + 1}" if m.get("repeats", 1) > 1 else "")
            + (f" f{run.get('fold', 0)}" if m.get("folds", 1) > 1 else ""))


def markdown_tables(summary: Mapping[str, Any]) -> str:
    """The absolute table, then the ratio table (value / baseline at the same rate)."""
    runs = _rows_in_order(summary)
    head = ["policy", "rate/s", *(c.header for c in COLUMNS), "traffic (calls)", "errors",
            "engine downs"]
    lines = [_md_row(head), _md_row(["---"] * len(head))]
    for run in runs:
        s = run["summary"]
        cells = [_num(_scaled(s, c)) for c in COLUMNS]
        lines.append(_md_row([_label(run, summary), f"{run['rate']:g}", *cells,
                              traffic_text(run),
                              str(s["errors"]), _downs_text(run)]))
    base = summary["meta"]["baseline"]
    cols = [c for c in COLUMNS if c.in_ratios]
    out = "\n".join([*(f"**{w}**\n" for w in summary["meta"].get("warnings", [])), *lines])
    if not any(baseline_run(summary, r["rate"]) for r in runs):
        return out + f"\n\n(no ratios: the baseline {base!r} was not run)"
    head = ["policy", "rate/s", *(c.name for c in cols)]
    ratio_lines = [_md_row(head), _md_row(["---"] * len(head))]
    for run in runs:
        b = _baseline_of(summary, run)
        if b is None:
            continue
        cells = [_ratio_text(lookup(run["summary"], c.key), lookup(b["summary"], c.key))
                 for c in cols]
        ratio_lines.append(_md_row([_label(run, summary), f"{run['rate']:g}", *cells]))
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
        s, b = run["summary"], _baseline_of(summary, run)
        row: dict[str, Any] = {"policy": run["policy"], "rate": run["rate"],
                               "repeat": run.get("repeat", 0), "fold": run.get("fold", 0),
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


PAIRS = (
    ("chimera:stjf", "chimera:fcfs", "STJF against FCFS engines, both routed by Chimera"),
    ("oracle", "chimera:stjf", "true remaining lengths (oracle) against predicted ones"),
    ("chimera:stjf", "chimera-static:stjf", "trained predictors against static priors"),
    ("chimera:stjf", "vllm:fcfs", "Chimera (routing + STJF) against the vLLM baseline"),
)
"""Comparisons the results page spells out when both policies were run."""


def interval_tables(summary: Mapping[str, Any]) -> str:
    """Every (policy, rate) with its 95% intervals, and every comparison with its interval
    and verdict (``intervals``: repeats and workflows resampled, paired)."""
    iv = summary.get("intervals")
    if not iv or not iv["values"]:
        return "(no intervals: no workflow records)"
    metrics = _metrics_in(iv["values"][0])
    head = ["policy", "rate/s", "repeats", *(m.name for m in metrics)]
    lines = [_md_row(head), _md_row(["---"] * len(head))]
    for row in iv["values"]:
        lines.append(_md_row([row["policy"], f"{row['rate']:g}", str(row["repeats"]),
                              *(_interval_text(row[m.key]) for m in metrics)]))
    head = ["policy", "against", "rate/s", *(_compared_name(m) for m in metrics)]
    comp = [_md_row(head), _md_row(["---"] * len(head))]
    for row in iv["comparisons"]:
        comp.append(_md_row([row["policy"], row["against"], f"{row['rate']:g}",
                             *(_comparison_text(row[m.key], m) for m in metrics)]))
    return ("\n".join(lines) + "\n\nComparisons (ratio A / B for latencies, A - B in points "
            f"for score; 95% intervals, {iv['draws']} paired bootstrap draws over repeats "
            "and workflows; **finding** when the interval excludes no-difference, else "
            "unresolved):\n\n" + "\n".join(comp))


def _metrics_in(row: Mapping[str, Any]) -> list[intervals.Metric]:
    """The metrics an intervals row holds (optional ones only where the replay had them)."""
    return [m for m in intervals.METRICS if m.key in row]


def _compared_name(m: intervals.Metric) -> str:
    return m.name.split(" (")[0] + (" difference" if m.difference else " ratio")


def _interval_text(i: Mapping[str, float] | None) -> str:
    return "-" if i is None else f"{_num(i['value'])} [{_num(i['low'])}, {_num(i['high'])}]"


def _comparison_text(c: Mapping[str, Any] | None, m: intervals.Metric) -> str:
    if c is None:
        return "-"
    if m.difference:
        text = f"{c['value']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]"
    else:
        text = f"{c['value']:.2f}x [{c['low']:.2f}, {c['high']:.2f}]"
    return f"**{text}**" if c["verdict"] == "finding" else f"{text} unresolved"


def observations(summary: Mapping[str, Any]) -> list[str]:
    """The comparisons of ``PAIRS`` with their intervals and verdicts, per rate."""
    iv = summary.get("intervals") or {"comparisons": []}
    found = {(c["policy"], c["against"], c["rate"]): c for c in iv["comparisons"]}
    out = []
    for rate in summary["meta"]["rates"]:
        for a, b, what in PAIRS:
            c = found.get((a, b, rate))
            if c is None:
                continue
            parts = []
            for m in _metrics_in(c):
                if c[m.key] is not None:
                    parts.append(f"{_compared_name(m)} {_plain(c[m.key], m)}")
            out.append(f"At {rate:g} workflows/s, `{a}` vs `{b}` ({what}): "
                       + "; ".join(parts) + ".")
    return out


def _plain(c: Mapping[str, Any], m: intervals.Metric) -> str:
    if m.difference:
        text = f"{c['value']:+.1f} points [{c['low']:+.1f}, {c['high']:+.1f}]"
    else:
        text = f"{c['value']:.2f}x [{c['low']:.2f}, {c['high']:.2f}]"
    return text + (" (finding)" if c["verdict"] == "finding" else " (unresolved)")
