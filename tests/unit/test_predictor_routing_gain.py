"""Share-based routing gain (issue 30): ``metrics.share_scores`` / ``recovered`` / ``apgr``
by hand-computed cases, and ``evaluation.routing_gain_report`` (which two models, the
bootstrap intervals, degenerate input)."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest

from router.predictors import metrics
from router.predictors.evaluation import confidence_report, routing_gain_report
from router.predictors.plots import save_figure

# ten prompts: each one's outcome on the small and the big model
SMALL = np.array([1, 0, 0, 1, 0, 1, 0, 0, 1, 0], dtype=float)  # mean 0.4
BIG = np.array([1, 1, 0, 0, 1, 1, 1, 0, 1, 0], dtype=float)  # mean 0.6
TRUE = BIG - SMALL  # [0, 1, 0, -1, 1, 0, 1, 0, 0, 0]: sum 2, mean 0.2
PRED = np.linspace(0.9, 0.0, 10)  # ranks the prompts in their listed order
NO_TIES = np.zeros(10)


def test_share_scores_by_hand() -> None:
    # share 0.2: the first two prompts go big (true gains 0 + 1)
    # predicted = (4 + 1) / 10; random = 0.4 + 0.2 x 0.2; oracle = (4 + 1 + 1) / 10
    assert metrics.share_scores(PRED, SMALL, BIG, 0.2, NO_TIES) == pytest.approx(
        (0.5, 0.44, 0.6))
    assert metrics.recovered(0.5, 0.44, 0.6) == pytest.approx(0.06 / 0.16)
    # share 0.4: the first four (gains 0 + 1 + 0 - 1 = 0): below random
    # predicted = 4 / 10; random = 0.4 + 0.4 x 0.2; oracle = (4 + 3) / 10 (three +1 gains)
    p, r, o = metrics.share_scores(PRED, SMALL, BIG, 0.4, NO_TIES)
    assert (p, r, o) == pytest.approx((0.4, 0.48, 0.7))
    assert metrics.recovered(p, r, o) == pytest.approx(-0.08 / 0.22)


def test_ties_are_broken_by_the_tiebreak() -> None:
    """A constant prediction sends the rows the tiebreak puts first (lowest first)."""
    tb = np.full(10, 0.5)
    tb[[1, 4]] = 0.0, 0.1  # the two +1 rows first
    assert metrics.share_scores(np.zeros(10), SMALL, BIG, 0.2, tb)[0] == pytest.approx(0.6)
    tb = np.full(10, 0.5)
    tb[[3, 0]] = 0.0, 0.1  # the -1 and a 0
    assert metrics.share_scores(np.zeros(10), SMALL, BIG, 0.2, tb)[0] == pytest.approx(0.3)


@pytest.mark.parametrize("share", metrics.SHARES)
def test_random_is_the_mean_over_every_choice_of_rows(share: float) -> None:
    """The random score is the exact mean of the predicted score over every set of
    share x n rows sent to the big model (each set chosen through the tiebreak)."""
    k = round(share * 10)
    got = []
    for rows in itertools.combinations(range(10), k):
        tb = np.ones(10)
        tb[list(rows)] = 0.0
        got.append(metrics.share_scores(np.zeros(10), SMALL, BIG, share, tb)[0])
    random = metrics.share_scores(PRED, SMALL, BIG, share, NO_TIES)[1]
    assert random == pytest.approx(np.mean(got))
    assert random == pytest.approx(share * BIG.mean() + (1 - share) * SMALL.mean())


def labels(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.random(n) < 0.4).astype(float), (rng.random(n) < 0.6).astype(float)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_perfect_recovers_all_and_reversed_is_negative(seed: int) -> None:
    small, big = labels(100, seed)
    tb = np.random.default_rng(seed).random(100)
    for share in metrics.SHARES:
        perfect = metrics.share_scores(big - small, small, big, share, tb)
        assert perfect[0] == perfect[2] > perfect[1]
        assert metrics.recovered(*perfect) == pytest.approx(1.0)
        assert metrics.recovered(*metrics.share_scores(small - big, small, big, share,
                                                       tb)) < 0
    assert metrics.apgr(big - small, small, big, seed=seed) == pytest.approx(1.0)
    assert metrics.apgr(small - big, small, big, seed=seed) < 0


def test_recovered_is_zero_when_the_oracle_gains_nothing() -> None:
    assert metrics.recovered(0.5, 0.5, 0.5) == 0.0
    assert metrics.recovered(0.4, 0.6, 0.5) == 0.0  # oracle below random
    same = np.array([1, 0, 1, 0, 1, 0, 1, 0, 1, 0], dtype=float)  # big == small
    for share in metrics.SHARES:
        assert metrics.recovered(*metrics.share_scores(PRED, same, same, share,
                                                       NO_TIES)) == 0.0
    assert metrics.apgr(PRED, same, same) == 0.0


def test_perfect_recovers_all_when_share_x_n_is_not_whole() -> None:
    """Random is scored at the share actually sent (k = round(s x n) of n rows), so a
    perfect router recovers everything whatever the rounding; with k = 0 all three tie."""
    small, big = np.array([0.0, 0, 1, 1, 1]), np.ones(5)  # the big model gains on two rows
    tb = np.zeros(5)
    assert metrics.recovered(*metrics.share_scores(big - small, small, big, 0.3,
                                                   tb)) == pytest.approx(1.0)  # k = 2
    p, r, o = metrics.share_scores(big - small, small, big, 0.1, tb)  # k = 0
    assert p == r == o == pytest.approx(0.6)


# ---- routing_gain_report ----

MODELS3 = ["mid", "weak", "strong"]


def table(problems: int = 30, per: int = 3, seed: int = 0, noise: float = 0.3
          ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(scores, labels, problems) for MODELS3, base rates about 0.5 / 0.2 / 0.7; the
    scores are each label plus noise (informative), a few labels unknown."""
    rng = np.random.default_rng(seed)
    n = problems * per
    p = np.array([0.5, 0.2, 0.7])
    y = (rng.random((n, 3)) < p).astype(float)
    scores = np.clip(0.5 * y + 0.25 + rng.normal(0, noise, (n, 3)), 0, 1)
    y[rng.random((n, 3)) < 0.05] = np.nan
    return scores, y, [f"p{i // per}" for i in range(n)]


def test_report_routes_between_the_two_models_of_highest_base_rate() -> None:
    scores, y, problems = table()
    r = routing_gain_report(scores, y, MODELS3, problems, seed=0, boot=200)
    assert (r["big"], r["small"]) == ("strong", "mid")
    both = ~np.isnan(y[:, [0, 2]]).any(axis=1)
    assert r["prompts"] == both.sum() and r["problems"] == 30
    # the point estimates are share_scores on those prompts, columns big = 2 / small = 0
    tb = np.random.default_rng(0).random(both.sum())
    gain = scores[both, 2] - scores[both, 0]
    rec = []
    for row, share in zip(r["per_share"], metrics.SHARES):
        p, rnd, o = metrics.share_scores(gain, y[both, 0], y[both, 2], share, tb)
        assert (row["share"], row["predicted"], row["random"], row["oracle"]) == \
            pytest.approx((share, p, rnd, o))
        assert row["gain_over_random"]["value"] == pytest.approx(p - rnd)
        rec.append(metrics.recovered(p, rnd, o))
        assert row["recovered"]["value"] == pytest.approx(rec[-1])
    assert r["apgr"]["value"] == pytest.approx(np.mean(rec))
    assert r["apgr"]["value"] > 0.2  # the scores carry the labels
    top = np.where(scores[both, 2] >= scores[both, 0], y[both, 2], y[both, 0])
    assert r["top_confidence_minus_always_big"]["value"] == pytest.approx(
        top.mean() - y[both, 2].mean())


def test_report_intervals_hold_the_point_estimate() -> None:
    scores, y, problems = table(seed=3)
    r = routing_gain_report(scores, y, MODELS3, problems, seed=1, boot=300)
    cis = [r["apgr"], r["top_confidence_minus_always_big"]]
    cis += [row[k] for row in r["per_share"] for k in ("gain_over_random", "recovered")]
    for ci in cis:
        assert ci["lo"] <= ci["value"] <= ci["hi"]
        assert ci["lo"] < ci["hi"]  # 30 problems: the draws differ
    # the same seed gives the same intervals; one problem only: no spread
    assert routing_gain_report(scores, y, MODELS3, problems, seed=1, boot=300) == r
    one = routing_gain_report(scores, y, MODELS3, ["p"] * len(y), seed=1, boot=50)
    assert one["apgr"]["lo"] == pytest.approx(one["apgr"]["value"]) == \
        pytest.approx(one["apgr"]["hi"])


def test_report_is_empty_for_degenerate_input() -> None:
    scores, y, problems = table(problems=4)
    assert routing_gain_report(scores[:, :1], y[:, :1], ["only"], problems, 0, boot=10) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of all-NaN columns
        assert routing_gain_report(scores, np.full_like(y, np.nan), MODELS3, problems, 0,
                                   boot=10) == {}
    # no prompt answered by both the big (column 2) and the small (column 0) model; the
    # third model, answered everywhere, has the lowest rate
    n = len(y)
    apart = np.full((n, 3), np.nan)
    apart[0::2, 0] = [1, 1, 0, 1, 0, 1]  # 4 / 6
    apart[1::2, 2] = [1, 1, 1, 1, 0, 1]  # 5 / 6
    apart[:, 1] = 0.0
    assert routing_gain_report(scores, apart, MODELS3, problems, 0, boot=10) == {}
    # exactly one prompt answered by both: still nothing to rank
    apart[0, 2] = 1.0
    assert routing_gain_report(scores, apart, MODELS3, problems, 0, boot=10) == {}
    # two: a report, between those two
    apart[2, 2] = 1.0
    assert routing_gain_report(scores, apart, MODELS3, problems, 0,
                               boot=10)["prompts"] == 2


def test_confidence_report_carries_it_with_problems() -> None:
    scores, y, problems = table(problems=10)
    assert "routing_gain" not in confidence_report(scores, y, MODELS3, 0)
    r = confidence_report(scores, y, MODELS3, 0, problems)["routing_gain"]
    assert r["big"] == "strong" and len(r["per_share"]) == len(metrics.SHARES)


def test_routing_panel_draws_the_report(tmp_path: Path) -> None:
    """router.evaluate's score-against-share panel renders from a report."""
    scores, y, problems = table()
    report = routing_gain_report(scores, y, MODELS3, problems, seed=0, boot=50)
    out = tmp_path / "routing.png"
    save_figure([("routing", (report, "as a router"))], out, "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
