"""Files of a replay, in its output folder (rewritten or appended after every run):

- ``requests.jsonl`` / ``requests.csv``: every LLM call, with its policy and rate;
- ``workflows.jsonl`` / ``workflows.csv``: every workflow;
- ``summary.json``: what was run (``meta``), every run's metrics (``runs``) and the
  intervals and comparisons over repeats and workflows (``intervals``);
- ``summary.csv``, ``summary.md``: the summary table, with ratios against the baseline;
- ``frontier.png``, ``cdf.png``, ``traffic.png``: the plots (``write_plots``):
  latency-versus-score frontier, latency CDFs, traffic share; ``mix.png`` when
  ``random_mix`` ran: score against the share of calls on its big model, the random
  mixes as a curve, every other policy as a point.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kernels_bench.lab.replay import intervals  # noqa: E402
from kernels_bench.lab.replay.report import PAIRS, flat_rows, markdown_tables  # noqa: E402

RESULTS_ROOT = Path("bench_results/replay")
"""Where a live replay writes its run folders by default (``<timestamp>`` below it)."""
TWIN_ROOT = Path("bench_results/twin")
"""Where a twin replay writes its run folders by default."""
SUMMARY = "summary.json"
PLOTS = ("frontier.png", "cdf.png", "traffic.png")
MIX_PLOT = "mix.png"
RANDOM_MIX = "random_mix"


def plots_of(summary: Mapping[str, Any]) -> list[str]:
    """The plots ``write_plots`` makes for ``summary``."""
    return [*PLOTS, *([MIX_PLOT] if big_model_of(summary) else [])]


def big_model_of(summary: Mapping[str, Any]) -> str | None:
    """The big model of the summary's ``random_mix`` specs (their ``big_model``), if any."""
    for p in summary["meta"]["policies"]:
        if p.get("router") == RANDOM_MIX:
            return str(dict(p.get("overrides", [])).get("big_model", "")) or None
    return None


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
    write_plots(folder, summary, workflows)


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


def _policies(summary: Mapping[str, Any]) -> list[str]:
    return [p["label"] for p in summary["meta"]["policies"]]


def _style(i: int) -> dict[str, Any]:
    """Colour and line style of the i-th policy: distinct for up to 30 policies."""
    return {"color": plt.get_cmap("tab10")(i % 10), "linestyle": ("-", "--", ":")[i // 10 % 3]}


def frontier(path: Path, summary: Mapping[str, Any]) -> None:
    """Score against mean E2E latency and E2E per token, one line per policy across
    the rates (points labelled with the rate), with the 95% intervals as error bars
    (pooled over repeats, ``intervals``)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    values = summary.get("intervals", {}).get("values", [])
    for i, policy in enumerate(_policies(summary)):
        rows = sorted((v for v in values if v["policy"] == policy and v["score"]),
                      key=lambda v: v["rate"])
        if not rows:
            continue
        y = np.array([[v["score"][k] for k in ("value", "low", "high")] for v in rows])
        for ax, key, scale in ((axes[0], "e2e_s.mean", 1.0),
                               (axes[1], "e2e_per_token_s.mean", 1e3)):
            x = scale * np.array([[v[key][k] for k in ("value", "low", "high")]
                                  for v in rows])
            line = ax.errorbar(x[:, 0], y[:, 0], xerr=_spread(x), yerr=_spread(y), capsize=2,
                               marker="os^"[i // 10 % 3], label=policy, **_style(i))
            for xi, yi, v in zip(x[:, 0], y[:, 0], rows):
                ax.annotate(f"{v['rate']:g}/s", (xi, yi), fontsize=7,
                            color=line.lines[0].get_color(), xytext=(3, 3),
                            textcoords="offset points")
    axes[0].set_xlabel("workflow E2E latency, mean (s)")
    axes[1].set_xlabel("E2E latency per output token, mean (ms)")
    for ax in axes:
        ax.set_ylabel("task score (points)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle("Latency vs score per policy across arrival rates, 95% intervals "
                 "(up-left is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _spread(v: np.ndarray) -> np.ndarray:
    """Error bars (2 x n) from rows of (value, low, high)."""
    return np.vstack([v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]])


def cdf(path: Path, summary: Mapping[str, Any], workflows: Sequence[Mapping[str, Any]]) -> None:
    """CDF of workflow E2E latency per policy, one panel per rate."""
    rates = summary["meta"]["rates"]
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 3.8), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for i, policy in enumerate(_policies(summary)):
            xs = np.sort([w["end_s"] - w["arrival_s"] for w in workflows
                          if w["policy"] == policy and w["rate"] == rate and not w["error"]])
            if xs.size:
                ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=policy,
                        **_style(i))
        ax.set_title(f"{rate:g} workflows/s")
        ax.set_xlabel("workflow E2E latency (s)")
        ax.set_ylabel("share of workflows")
        ax.grid(alpha=0.3)
    handles = {label: h for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels())}
    if handles:
        axes[0][-1].legend(handles.values(), handles.keys(), fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def traffic(path: Path, summary: Mapping[str, Any]) -> None:
    """Share of calls per served model, per policy (mean over repeats), one panel per
    rate."""
    rates = summary["meta"]["rates"]
    policies = _policies(summary)
    models = sorted({m for r in summary["runs"] for m in r["summary"]["traffic"]})
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 0.45 * len(policies) + 1.6),
                             squeeze=False)
    for ax, rate in zip(axes[0], rates):
        shares: dict[str, dict[str, float]] = {p: {} for p in policies}
        runs = [r for r in summary["runs"] if r["rate"] == rate]
        for p in policies:
            mine = [r["summary"]["traffic"] for r in runs if r["policy"] == p]
            shares[p] = {m: sum(t.get(m, {}).get("calls", 0.0) for t in mine) / len(mine)
                         for m in models} if mine else {}
        left = np.zeros(len(policies))
        for m in models:
            width = np.array([shares[p].get(m, 0.0) for p in policies])
            ax.barh(policies, width, left=left, label=m)
            left += width
        ax.set_xlim(0, 1)
        ax.invert_yaxis()
        ax.set_title(f"{rate:g} workflows/s")
        ax.set_xlabel("share of calls")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def mix(path: Path, summary: Mapping[str, Any], big: str) -> None:
    """Score against the share of calls on ``big`` (mean over repeats), one panel per
    rate: the ``random_mix`` specs joined in order of share (the random router's curve),
    every other policy a point; 95% intervals of the score. Above the curve: better than
    a random choice sending as many calls to the big model."""
    rates = summary["meta"]["rates"]
    values = summary.get("intervals", {}).get("values", [])
    fig, axes = plt.subplots(1, len(rates), figsize=(5.5 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        curve = []
        for i, p in enumerate(summary["meta"]["policies"]):
            label = p["label"]
            shares = [r["summary"]["traffic"].get(big, {}).get("calls", 0.0)
                      for r in summary["runs"] if r["policy"] == label and r["rate"] == rate]
            score = next((v["score"] for v in values if v["policy"] == label
                          and v["rate"] == rate and v["score"]), None)
            if not shares or score is None:
                continue
            x, y = float(np.mean(shares)), score
            err = [[y["value"] - y["low"]], [y["high"] - y["value"]]]
            if p.get("router") == RANDOM_MIX:
                curve.append((x, y["value"], err))
                continue
            ax.errorbar([x], [y["value"]], yerr=err, marker="os^"[i // 10 % 3], capsize=3,
                        label=label, linestyle="none", color=_style(i)["color"])
        if curve:
            curve.sort()
            ax.errorbar([c[0] for c in curve], [c[1] for c in curve],
                        yerr=np.hstack([c[2] for c in curve]), color="grey", marker=".",
                        capsize=2, label="random_mix (random choice at a share)")
        ax.set_title(f"{rate:g} workflows/s")
        ax.set_xlabel(f"share of calls on {big}")
        ax.set_ylabel("task score (points)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(folder: Path, summary: Mapping[str, Any],
              workflows: Sequence[Mapping[str, Any]]) -> None:
    if not summary["runs"]:
        return
    frontier(folder / PLOTS[0], summary)
    cdf(folder / PLOTS[1], summary, workflows)
    traffic(folder / PLOTS[2], summary)
    big = big_model_of(summary)
    if big:
        mix(folder / MIX_PLOT, summary, big)
