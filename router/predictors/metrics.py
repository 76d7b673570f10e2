"""Evaluation metrics, one formula each, with the baselines the papers compare against."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score


def kendall_tau_distance(score: np.ndarray, truth: np.ndarray) -> float:
    """(1 - tau_b) / 2 between the order by ``score`` and the oracle order by ``truth``:
    the share of discordant pairs (0 = oracle order, 0.5 = unrelated, 1 = reversed)."""
    tau = stats.kendalltau(score, truth).statistic
    return float((1 - tau) / 2) if np.isfinite(tau) else 0.5


def fcfs_tau_distance(truth: np.ndarray, seed: int, repeats: int = 10) -> float:
    """FCFS: arrival order is unrelated to length; mean distance over seeded shuffles."""
    rng = np.random.default_rng(seed)
    return float(np.mean([kendall_tau_distance(rng.permutation(len(truth)), truth)
                          for _ in range(repeats)]))


def average_precision(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """AP of ``scores`` for binary ``labels`` (None when a class is absent)."""
    if labels.min() == labels.max():
        return None
    return float(average_precision_score(labels, scores))


def auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    if labels.min() == labels.max():
        return None
    return float(roc_auc_score(labels, scores))


def brier(labels: np.ndarray, probs: np.ndarray) -> float:
    """mean (p - y)^2."""
    return float(np.mean((probs - labels) ** 2))


def reliability(labels: np.ndarray, probs: np.ndarray, bins: int = 10
                ) -> list[dict[str, float]]:
    """Per equal-width probability bin: count, mean confidence, observed frequency."""
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(probs, edges[1:-1]), 0, bins - 1)
    return [{"lo": float(edges[b]), "hi": float(edges[b + 1]), "count": int((idx == b).sum()),
             "confidence": float(probs[idx == b].mean()), "frequency": float(labels[idx == b]
                                                                             .mean())}
            for b in range(bins) if (idx == b).any()]


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = 10
                               ) -> float:
    """ECE = sum over bins of count/N x |frequency - confidence|."""
    rows = reliability(labels, probs, bins)
    return float(sum(r["count"] * abs(r["frequency"] - r["confidence"]) for r in rows)
                 / max(1, len(labels)))


def mape(pred: np.ndarray, truth: np.ndarray) -> float:
    """mean |pred - truth| / truth."""
    return float(np.mean(np.abs(pred - truth) / np.maximum(truth, 1e-9)))


SHARES = (0.1, 0.2, 0.3, 0.4, 0.5)
"""Shares of workflows sent to the big model at which a router is judged (issue 30)."""


def share_scores(gain: np.ndarray, small: np.ndarray, big: np.ndarray, share: float,
                 tiebreak: np.ndarray) -> tuple[float, float, float]:
    """Mean score (predicted, random, oracle) when ``share`` of the rows go to the big model.

    ``small`` / ``big``: each row's outcome on either model (0/1 or P(correct));
    predicted: the k = round(share x n) rows with the largest predicted ``gain`` (q_big -
    q_small; ties broken by ``tiebreak``); random: k/n x mean(big) + (1 - k/n) x
    mean(small) (its expectation at the same k);
    oracle: the rows with the largest true gain big - small."""
    n = len(gain)
    k = int(round(share * n))
    order = np.lexsort((tiebreak, -gain))[:k]
    true_gain = big - small
    predicted = (small.sum() + true_gain[order].sum()) / n
    random = small.mean() + k / n * true_gain.mean()  # the share actually sent: k of n
    oracle = (small.sum() + np.sort(true_gain)[::-1][:k].sum()) / n
    return float(predicted), float(random), float(oracle)


def recovered(predicted: float, random: float, oracle: float) -> float:
    """The share of the oracle's gain over random that the prediction recovers:
    (predicted - random) / (oracle - random); 0 when the oracle gains nothing."""
    return (predicted - random) / (oracle - random) if oracle > random else 0.0


def mean_recovered(per_share: Sequence[tuple[float, float, float]]) -> float:
    """RouteLLM's APGR as issue 30 states it: ``recovered`` averaged over the shares'
    (predicted, random, oracle) scores."""
    return float(np.mean([recovered(*x) for x in per_share]))


def apgr(gain: np.ndarray, small: np.ndarray, big: np.ndarray,
         shares: tuple[float, ...] = SHARES, seed: int = 0) -> float:
    """``mean_recovered`` at ``shares``, ties broken by a seeded draw."""
    tb = np.random.default_rng(seed).random(len(gain))
    return mean_recovered([share_scores(gain, small, big, s, tb) for s in shares])
