"""``python -m kernels_bench.lab.twin.validate``: the twin against live replays of the same
configuration, per policy and rate (docs/research/twin.md, "Validation").

Per (policy, rate) both hold: mean E2E with its 95% interval (``replay.intervals``: the
bootstrap over repeats and workflows), mean queueing time, TTFT and TPOT (means over the
runs), and the twin's error ``twin / live - 1``. The twin *matches* when its mean is inside
the live interval or within ``TOLERANCE``. Ranking: for every pair of policies at a rate
whose live intervals do not overlap, whether the twin orders them the same way.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernels_bench.lab.replay.intervals import METRICS, Interval, interval, matrix
from kernels_bench.lab.replay.metrics import lookup
from kernels_bench.lab.replay.output import load_summary, read_jsonl
from kernels_bench.lab.replay.records import WorkflowRecord, from_row

TOLERANCE = 0.15
"""The issue's bar: the twin's mean E2E within 15% of the live one (or in its interval)."""
E2E = METRICS[0]

Key = tuple[str, float]
"""(policy, rate)."""


def runs_of(folders: Sequence[Path], exclude: set[tuple[str, str, float, int]]
            ) -> dict[Key, list[tuple[dict[str, Any], list[WorkflowRecord]]]]:
    """Per (policy, rate): each run's summary and workflows, from every folder;
    ``exclude``: (folder name, policy, rate, repeat from 1) of runs left out."""
    out: dict[Key, list[tuple[dict[str, Any], list[WorkflowRecord]]]] = {}
    for folder in folders:
        flows: dict[tuple[str, float, int, int], list[WorkflowRecord]] = {}
        for w in read_jsonl(folder / "workflows.jsonl"):
            flows.setdefault((w["policy"], float(w["rate"]), w["repeat"], w.get("fold", 0)),
                             []).append(from_row(WorkflowRecord, w))
        for run in load_summary(folder)["runs"]:
            key = (run["policy"], float(run["rate"]))
            if (folder.name, *key, run["repeat"] + 1) not in exclude:
                out.setdefault(key, []).append(
                    (run["summary"], flows.get((*key, run["repeat"], run.get("fold", 0)), [])))
    return out


def e2e_interval(runs: Sequence[tuple[dict[str, Any], list[WorkflowRecord]]]
                 ) -> Interval | None:
    pairs = [(i, w) for i, (_, flows) in enumerate(runs) for w in flows]
    jobs = sorted({w.job_id for _, w in pairs})
    return interval(matrix(pairs, E2E, list(range(len(runs))), jobs))


def _mean_of(runs: Sequence[tuple[dict[str, Any], list[WorkflowRecord]]], key: str
             ) -> float | None:
    """Mean over runs of a summary metric (``metrics.lookup``'s dotted key)."""
    values = [v for summary, _ in runs if (v := lookup(summary, key)) is not None]
    return statistics.fmean(values) if values else None


def matches(twin: float, live: Interval) -> bool:
    """Inside the live interval, or within ``TOLERANCE`` of the live mean."""
    return live.low <= twin <= live.high or abs(twin / live.value - 1) <= TOLERANCE


def compare(live: Mapping[Key, Any], twin: Mapping[Key, Any]) -> dict[str, Any]:
    """Rows per (policy, rate) both hold, and the ranking check per rate."""
    rows, e2e = [], {}
    for key in sorted(set(live) & set(twin), key=lambda k: (k[1], k[0])):
        li, ti = e2e_interval(live[key]), e2e_interval(twin[key])
        if li is None or ti is None:
            continue
        e2e[key] = (li, ti)
        rows.append({
            "policy": key[0], "rate": key[1], "live_runs": len(live[key]),
            "live": li, "twin": ti, "error": ti.value / li.value - 1,
            "matches": matches(ti.value, li),
            **{f"{side}_{m}": _mean_of(runs[key], path)
               for side, runs in (("live", live), ("twin", twin))
               for m, path in (("queue", "queue_s.mean"), ("ttft", "ttft_s.mean"),
                               ("tpot", "tpot_s.mean"))}})
    ranking = []
    for (a, b) in itertools.combinations(sorted(e2e), 2):
        if a[1] != b[1]:
            continue
        (la, ta), (lb, tb) = e2e[a], e2e[b]
        if la.high < lb.low or lb.high < la.low:
            ranking.append({"rate": a[1], "faster_live": a[0] if la.value < lb.value else b[0],
                            "slower_live": b[0] if la.value < lb.value else a[0],
                            "same": (la.value < lb.value) == (ta.value < tb.value)})
    return {"rows": rows, "ranking": ranking}


def markdown(result: Mapping[str, Any]) -> str:
    def ci(i: Interval) -> str:
        return f"{i.value:.2f} [{i.low:.2f}, {i.high:.2f}]"

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1e3 * v:.0f}"

    lines = ["| policy | rate/s | live runs | live E2E mean s [95%] | twin E2E mean s [95%] "
             "| twin error | matches | queue ms live / twin | TTFT ms live / twin "
             "| TPOT ms live / twin |", "|" + " --- |" * 10]
    for r in result["rows"]:
        lines.append(
            f"| {r['policy']} | {r['rate']:g} | {r['live_runs']} | {ci(r['live'])} | "
            f"{ci(r['twin'])} | {100 * r['error']:+.0f}% | {'yes' if r['matches'] else 'no'} | "
            f"{ms(r['live_queue'])} / {ms(r['twin_queue'])} | {ms(r['live_ttft'])} / "
            f"{ms(r['twin_ttft'])} | {ms(r['live_tpot'])} / {ms(r['twin_tpot'])} |")
    n = sum(r["matches"] for r in result["rows"])
    lines.append(f"\nThe twin matches (inside the live interval or within "
                 f"{TOLERANCE:.0%}) in {n} of {len(result['rows'])} (policy, rate) cells.")
    if result["ranking"]:
        same = sum(p["same"] for p in result["ranking"])
        lines.append(f"Pairs whose live intervals separate: {len(result['ranking'])}; the twin "
                     f"orders {same} of them as live does" + ("" if same == len(
                         result["ranking"]) else " (different: " + ", ".join(
                         f"{p['faster_live']} < {p['slower_live']} @ {p['rate']:g}/s"
                         for p in result["ranking"] if not p["same"]) + ")") + ".")
    else:
        lines.append("No pair of policies separates in the live intervals: the ranking "
                     "cannot be checked.")
    return "\n".join(lines)


def _exclusion(text: str) -> tuple[str, str, float, int]:
    """``FOLDER/POLICY@RATE#REPEAT`` (the folder's name; repeat from 1)."""
    folder, _, rest = text.partition("/")
    head, _, repeat = rest.rpartition("#")
    policy, _, rate = head.rpartition("@")
    try:
        return folder, policy, float(rate), int(repeat)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FOLDER/POLICY@RATE#REPEAT"
                                         ) from None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.validate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--live", type=Path, nargs="+", required=True, help="live replay folders")
    p.add_argument("--twin", type=Path, nargs="+", required=True, help="twin replay folders")
    p.add_argument("--exclude", type=_exclusion, nargs="*", default=[],
                   metavar="FOLDER/POLICY@RATE#REPEAT",
                   help="live runs to leave out (say why in the docs)")
    p.add_argument("--out", type=Path, help="write the table here (markdown)")
    a = p.parse_args(argv)
    try:
        text = markdown(compare(runs_of(a.live, set(a.exclude)), runs_of(a.twin, set())))
    except (ValueError, OSError, KeyError) as e:
        raise SystemExit(f"error: {e}") from None
    print(text)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
