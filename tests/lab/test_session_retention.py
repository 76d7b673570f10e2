"""The live session-retention study's arithmetic (the live run itself:
docs/research/long-sessions.md)."""

from __future__ import annotations

from kernels_bench.lab.studies.session_retention import ratio_interval, summarize


def test_the_ratio_interval_resamples_pairs() -> None:
    point, low, high = ratio_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert point == low == high == 0.5
    point, low, high = ratio_interval([1.0, 4.0], [2.0, 2.0])
    assert point == 1.25 and low == 0.5 and high == 2.0


def test_the_summary_pairs_sessions_of_both_arms() -> None:
    row = {"wall_s": 2.0, "prompt": [10, 30], "cached": [0, 20], "recomputed": 10}
    out = summarize({"retain": [row], "plain": [{**row, "recomputed": 20, "wall_s": 4.0}]})
    assert out["retain"]["recomputed_tokens_per_session"] == 10
    assert out["recomputed_retain_over_plain"] == (0.5, 0.5, 0.5)
    assert out["wall_retain_over_plain"] == (0.5, 0.5, 0.5)
