"""Files of a replay, in its output folder (rewritten or appended after every run):

- ``requests.jsonl`` / ``requests.csv``: every LLM call, with its policy and rate;
- ``workflows.jsonl`` / ``workflows.csv``: every workflow;
- ``summary.json``: what was run (``meta``), every run's metrics (``runs``) and the
  intervals and comparisons over repeats and workflows (``intervals``);
- ``summary.csv``, ``summary.md``: the summary table, with ratios against the baseline;
- ``frontier.png``, ``cdf.png``, ``traffic.png``: the plots (``plots``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernels_bench.replay import intervals, plots
from kernels_bench.replay.report import PAIRS, flat_rows, markdown_tables

SUMMARY = "summary.json"


def _rows(records: Sequence[Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"policy": run["policy"], "rate": run["rate"], "repeat": run["repeat"],
             "fold": run.get("fold", 0),
             **dataclasses.asdict(r)} for r in records]


def _append(folder: Path, stem: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    with (folder / f"{stem}.jsonl").open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    path = folder / f"{stem}.csv"
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: ";".join(v) if isinstance(v, list) else v
                             for k, v in row.items()})


def write_run(folder: Path, run: dict[str, Any]) -> None:
    """Append one run's calls and workflows."""
    _append(folder, "requests", _rows(run["requests"], run))
    _append(folder, "workflows", _rows(run["workflows"], run))


def write_summary(folder: Path, summary: dict[str, Any]) -> None:
    """Rewrite the summary files and plots from ``summary`` (meta + runs so far), with
    the intervals of the workflows written so far."""
    workflows = read_jsonl(folder / "workflows.jsonl")
    summary["intervals"] = summary_intervals(workflows, summary["meta"])
    (folder / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    rows = flat_rows(summary)
    with (folder / "summary.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    (folder / "summary.md").write_text(markdown_tables(summary) + "\n", encoding="utf-8")
    plots.write_all(folder, summary, workflows)


def summary_intervals(workflows: Sequence[dict[str, Any]], meta: dict[str, Any]
                      ) -> dict[str, Any]:
    """The intervals of a replay's summary (``intervals.summarize``) from its workflow rows:
    against its baseline, with the named ``PAIRS``, seeded by its seed."""
    return intervals.summarize(workflows, meta["baseline"], [(a, b) for a, b, _ in PAIRS],
                               meta["seed"])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_summary(folder: Path) -> dict[str, Any]:
    path = folder / SUMMARY
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a replay summary ({e})") from None
