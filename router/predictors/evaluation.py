"""Held-out evaluation of each predictor against its naive baseline.

- confidences (semantic router, capability model, KNN quality): per-model average
  precision vs the model's base rate (the AP of a constant score), ROC AUC vs 0.5,
  Brier score vs the base rate's, a reliability table, and routing accuracy of the
  most-confident model vs a random model, the best single model and the oracle;
- lengths (length predictor): Kendall's tau distance to the oracle order (Chimera Table 3)
  vs FCFS and the input-length proxy, on every held-out stage and on first stages only;
  MAE and quantile-interval coverage;
- KNN output lengths and TPOT: MAE / MAPE vs the per-model (per-engine) mean.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from router.predictors import metrics
from router.predictors.records import StageRecord

PAPERS: dict[str, dict[str, Any]] = {
    "semantic_router": {"metric": "macro mAP", "Chimera Table 2": {"APPS": 0.52, "MATH": 0.74}},
    "length": {"metric": "Kendall tau distance",
               "Chimera Table 3": {"min": 0.12, "max": 0.27}},
}


def confidence_report(scores: np.ndarray, labels: np.ndarray, models: Sequence[str],
                      seed: int, problems: Sequence[str] | None = None,
                      expected: np.ndarray | None = None) -> dict[str, Any]:
    """``scores`` and ``labels`` (one outcome each, 1 / 0) are (prompts, models); NaN labels
    are unknown. With each prompt's problem, also the share-based routing gain
    (``routing_gain_report``). ``expected`` (default ``labels``): P(correct) per prompt
    and model (mean over sampled runs), which the routing reports score instead of the one
    outcome; the classification metrics (AP, AUC, Brier, ECE) keep ``labels``."""
    per_model: dict[str, Any] = {}
    for j, m in enumerate(models):
        known = ~np.isnan(labels[:, j])
        y, p = labels[known, j], scores[known, j]
        if not len(y):
            continue
        per_model[m] = {"n": int(len(y)), "base_rate": float(y.mean()),
                        "ap": metrics.average_precision(y, p), "auc": metrics.auc(y, p),
                        "brier": metrics.brier(y, p),
                        "brier_base_rate": metrics.brier(y, np.full(len(y), y.mean()))}
    graded = [v for v in per_model.values() if v["ap"] is not None]
    known = ~np.isnan(labels)
    out: dict[str, Any] = {
        "macro_map": float(np.mean([v["ap"] for v in graded])) if graded else None,
        "macro_base_rate": float(np.mean([v["base_rate"] for v in graded])) if graded else None,
        "macro_auc": float(np.mean([v["auc"] for v in graded])) if graded else None,
        "ece": metrics.expected_calibration_error(labels[known], scores[known]),
        "reliability": metrics.reliability(labels[known], scores[known]),
        "per_model": per_model,
    }
    scored = labels if expected is None else expected
    out["routing"] = routing_report(scores, scored, models, seed)
    if problems is not None:
        out["routing_gain"] = routing_gain_report(scores, scored, models, problems, seed)
    return out


def routing_report(scores: np.ndarray, labels: np.ndarray, models: Sequence[str],
                   seed: int) -> dict[str, Any]:
    """Accuracy (expected score, for P(correct) labels) when each prompt goes to its
    highest-scored model, on prompts every model answered, beside a random model, the best
    single model and the oracle."""
    full = ~np.isnan(labels).any(axis=1)
    if not full.any():
        return {}
    y, p = labels[full], scores[full]
    rng = np.random.default_rng(seed)
    single = y.mean(axis=0)
    return {"prompts": int(full.sum()),
            "top_confidence": float(y[np.arange(len(y)), p.argmax(axis=1)].mean()),
            "random_model": float(y[np.arange(len(y)), rng.integers(0, len(models),
                                                                      len(y))].mean()),
            "best_single_model": float(single.max()),
            "best_single_model_name": models[int(single.argmax())],
            "oracle": float(y.max(axis=1).mean())}


def problem_resamples(problems: Sequence[str], seed: int, boot: int
                      ) -> Iterator[np.ndarray]:
    """``boot`` bootstrap resamples of the rows (indices) that draw whole problems with
    replacement, seeded: a percentile interval over them is clustered by problem."""
    groups = np.asarray(problems)
    rows_of = [np.flatnonzero(groups == p) for p in dict.fromkeys(groups)]
    rng = np.random.default_rng(seed)
    for _ in range(boot):
        yield np.concatenate([rows_of[i] for i in rng.integers(0, len(rows_of), len(rows_of))])


def routing_gain_report(scores: np.ndarray, labels: np.ndarray, models: Sequence[str],
                        problems: Sequence[str], seed: int, boot: int = 1000
                        ) -> dict[str, Any]:
    """The predictor as a router between the two models of highest base rate (big: the
    higher), on prompts both answered: at each share of ``metrics.SHARES`` sent to the big
    model by largest predicted gain q_big - q_small, the score beside a random choice and
    the oracle at the same share, the gain over random and the share of the oracle's gain
    recovered; their mean over shares (APGR); the top-confidence choice against always
    the big model. 95% intervals: percentile bootstrap over problems (``boot`` draws)."""
    rates = np.nanmean(labels, axis=0)
    if len(models) < 2 or np.isnan(rates).all():
        return {}
    big, small = (int(j) for j in np.argsort(-np.nan_to_num(rates, nan=-1))[:2])
    both = ~np.isnan(labels[:, [small, big]]).any(axis=1)
    if both.sum() < 2:
        return {}
    gain = (scores[:, big] - scores[:, small])[both]
    ys, yb = labels[both, small], labels[both, big]
    top = np.where(scores[both, big] >= scores[both, small], yb, ys)
    groups = np.asarray(problems)[both]
    tb = np.random.default_rng(seed).random(len(gain))

    def stats(idx: np.ndarray) -> np.ndarray:
        """Per share: gain over random and recovered; then APGR and top - big."""
        per = [metrics.share_scores(gain[idx], ys[idx], yb[idx], s, tb[idx])
               for s in metrics.SHARES]
        over = [p - r for p, r, _ in per]
        rec = [metrics.recovered(*x) for x in per]
        return np.array([*over, *rec, metrics.mean_recovered(per),
                         top[idx].mean() - yb[idx].mean()])

    point = stats(np.arange(len(gain)))
    draws = np.array([stats(idx) for idx in problem_resamples(groups, seed, boot)])
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    k = len(metrics.SHARES)

    def ci(i: int) -> dict[str, float]:
        return {"value": float(point[i]), "lo": float(lo[i]), "hi": float(hi[i])}

    per_share = []
    for j, s in enumerate(metrics.SHARES):
        p, r, o = metrics.share_scores(gain, ys, yb, s, tb)
        per_share.append({"share": s, "predicted": p, "random": r, "oracle": o,
                          "gain_over_random": ci(j), "recovered": ci(k + j)})
    return {"small": models[small], "big": models[big], "prompts": int(both.sum()),
            "problems": len(set(groups)), "per_share": per_share, "apgr": ci(2 * k),
            "top_confidence_minus_always_big": ci(2 * k + 1)}


def tau_report(pred: np.ndarray, truth: np.ndarray, prompt_tokens: np.ndarray,
               seed: int) -> dict[str, Any]:
    return {"n": int(len(truth)),
            "kendall_tau_distance": metrics.kendall_tau_distance(pred, truth),
            "fcfs": metrics.fcfs_tau_distance(truth, seed),
            "input_length_proxy": metrics.kendall_tau_distance(prompt_tokens, truth)}


def length_report(pred: np.ndarray, records: Sequence[StageRecord], seed: int
                  ) -> dict[str, Any]:
    """``pred`` is (records, 3): quantiles 0.5, 0.1, 0.9 of each record's own model."""
    truth = np.array([r.remaining_tokens for r in records], dtype=float)
    tokens = np.array([r.prompt_tokens for r in records], dtype=float)
    first = np.array([r.stage_index == 0 for r in records])
    med, lo, hi = pred[:, 0], pred[:, 1], pred[:, 2]
    out: dict[str, Any] = {"all_stages": tau_report(med, truth, tokens, seed)}
    if first.any() and not first.all():
        out["first_stages"] = tau_report(med[first], truth[first], tokens[first], seed)
    out["per_model"] = {}
    for m in sorted({r.model for r in records}):
        mine = np.array([r.model == m for r in records])
        out["per_model"][m] = tau_report(med[mine], truth[mine], tokens[mine], seed)
    out["mae_tokens"] = float(np.mean(np.abs(med - truth)))
    out["interval_10_90_coverage"] = float(np.mean((truth >= lo) & (truth <= hi)))
    return out


def regression_report(pred: np.ndarray, truth: np.ndarray, groups: Sequence[str]
                      ) -> dict[str, Any]:
    """Per group MAE and MAPE of ``pred`` beside the group's mean as the prediction."""
    g = np.asarray(groups)
    out: dict[str, Any] = {}
    for name in sorted(set(groups)):
        mine = g == name
        y, p = truth[mine], pred[mine]
        base = np.full(len(y), y.mean())
        out[name] = {"n": int(len(y)), "mae": float(np.mean(np.abs(p - y))),
                     "mae_mean_baseline": float(np.mean(np.abs(base - y))),
                     "mape": metrics.mape(p, y), "mape_mean_baseline": metrics.mape(base, y)}
    return out
