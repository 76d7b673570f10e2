"""Evaluation plots: reliability diagram for confidences, predicted-vs-true for lengths,
score against the share sent to the big model for a router."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402


def reliability_axes(ax: Axes, rows: Sequence[dict[str, Any]], title: str) -> None:
    """Observed frequency vs mean confidence per bin (marker area ~ count)."""
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect calibration")
    if rows:
        counts = np.array([r["count"] for r in rows], dtype=float)
        ax.scatter([r["confidence"] for r in rows], [r["frequency"] for r in rows],
                   s=20 + 200 * counts / counts.max(), zorder=3, label="bins (area ~ n)")
        ax.plot([r["confidence"] for r in rows], [r["frequency"] for r in rows], lw=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted probability",
           ylabel="observed frequency correct", title=title)
    ax.legend(loc="upper left", fontsize=8)


def scatter_axes(ax: Axes, pred: np.ndarray, truth: np.ndarray, title: str, unit: str) -> None:
    """Predicted vs true on log axes with the identity line."""
    lo = max(1e-3, float(min(pred.min(), truth.min())))
    hi = float(max(pred.max(), truth.max()))
    ax.scatter(truth, pred, s=6, alpha=0.4)
    ax.plot([lo, hi], [lo, hi], "--", color="grey", lw=1)
    ax.set(xscale="log", yscale="log", xlabel=f"true {unit}", ylabel=f"predicted {unit}",
           title=title)


def routing_axes(ax: Axes, gain: dict[str, Any], title: str) -> None:
    """Mean score against the share of prompts sent to the big model: the oracle, the
    predictor's ranking (with its 95% interval of the gain over random) and random."""
    rows = gain["per_share"]
    share = [100 * r["share"] for r in rows]
    random = np.array([r["random"] for r in rows])
    ax.plot(share, [100 * r["oracle"] for r in rows], "^-", color="grey", label="oracle")
    ax.plot(share, 100 * random, "--", color="black", label="random")
    pred = [100 * r["predicted"] for r in rows]
    lo = [100 * (x + r["gain_over_random"]["lo"]) for x, r in zip(random, rows)]
    hi = [100 * (x + r["gain_over_random"]["hi"]) for x, r in zip(random, rows)]
    ax.plot(share, pred, "o-", label=f"predicted (APGR {gain['apgr']['value']:.2f})")
    ax.fill_between(share, lo, hi, alpha=0.2, label="95% interval")
    ax.set(xlabel=f"% of prompts sent to {gain['big']} (rest: {gain['small']})",
           ylabel="score (% correct)", title=title)
    ax.legend(loc="upper left", fontsize=8)


PANELS = {"reliability": reliability_axes, "scatter": scatter_axes, "routing": routing_axes}


def save_figure(panels: Sequence[tuple[str, Any]], path: str | Path, suptitle: str) -> None:
    """One row of panels: ``("reliability", (rows, title))``,
    ``("scatter", (pred, truth, title, unit))`` or ``("routing", (routing_gain, title))``."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
    for ax, (kind, args) in zip(axes[0], panels):
        PANELS[kind](ax, *args)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
