"""``python -m kernels_bench.lab.twin.report DIR...``: one compact table per twin replay, as
docs/research/twin.md shows its scenarios: per policy and rate, mean E2E and score with their 95%
intervals, both against the baseline (a *finding* when the interval excludes
no-difference), the traffic split, the engines' busy fraction and the router's time per
call, and the twin's own speed."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernels_bench.lab.replay.output import load_summary


def _ci(v: Mapping[str, Any] | None, fmt: str = "{:.2f}") -> str:
    if not v:
        return "-"
    text = (fmt + " [" + fmt + ", " + fmt + "]").format(v["value"], v["low"], v["high"])
    return f"**{text}**" if v.get("verdict") == "finding" else text


def table(summary: Mapping[str, Any]) -> str:
    """The markdown table of one twin replay's summary."""
    iv, base = summary["intervals"], summary["meta"]["baseline"]
    comps = {(c["policy"], c["rate"]): c for c in iv["comparisons"] if c["against"] == base}
    runs: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in summary["runs"]:
        runs.setdefault((r["policy"], float(r["rate"])), []).append(r["summary"])
    lines = [f"| policy | rate/s | E2E mean s | E2E / {base} | score (points) | score - {base} "
             "| traffic (calls) | busy | router ms/call | virtual s / wall s |",
             "|" + " --- |" * 10]
    for v in iv["values"]:
        key = (v["policy"], float(v["rate"]))
        c = comps.get(key, {})
        ss = runs.get(key, [])
        traffic = " / ".join(f"{m} {100 * t['calls']:.0f}%"
                             for m, t in (ss[0]["traffic"] if ss else {}).items())
        busy = [s["twin"]["busy"] for s in ss if s.get("twin", {}).get("busy") is not None]
        decision = [s["router"]["decision_s_mean"] for s in ss
                    if s["router"]["decision_s_mean"] is not None]
        speed = [s["twin"]["virtual_s_per_wall_s"] for s in ss if s.get("twin")]
        lines.append(
            f"| {v['policy']} | {v['rate']:g} | {_ci(v['e2e_s.mean'])} | "
            f"{_ci(c.get('e2e_s.mean'), '{:.2f}') if c and v['policy'] != base else '-'} | "
            f"{_ci(v['score'], '{:.1f}')} | "
            f"{_ci(c.get('score'), '{:+.1f}') if c and v['policy'] != base else '-'} | "
            f"{traffic} | {_mean(busy, '{:.2f}')} | {_mean(decision, '{:.1f}', 1e3)} | "
            f"{_mean(speed, '{:.2f}')} |")
    return "\n".join(lines)


def _mean(xs: list[float], fmt: str, scale: float = 1.0) -> str:
    return fmt.format(scale * sum(xs) / len(xs)) if xs else "-"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+", help="twin (or live) replay folders")
    a = p.parse_args(argv)
    for folder in a.folders:
        try:
            summary = load_summary(folder)
            text = f"### {folder.name}\n\n`{summary['meta']['command']}`\n\n{table(summary)}\n"
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        except (KeyError, TypeError) as e:
            raise SystemExit(f"error: {folder}: not a finished replay summary (no {e})") from None
        print(text)


if __name__ == "__main__":
    main()
