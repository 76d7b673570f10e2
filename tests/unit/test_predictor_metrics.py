"""Predictor formulas and metrics, checked by hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_ext.telemetry import SchedulerSnapshot
from router.predictors import metrics
from router.predictors.features import language, length_bucket, task_type
from router.predictors.knn import (KnnSettings, inverse_distance_weights,
                                   known_weighted_means, neighbour_weights,
                                   weighted_means)
from router.predictors.records import held_out
from router.predictors.semantic import logit, masked_bce
from router.predictors.tpot import samples, tpot_ms


def test_kendall_tau_distance() -> None:
    truth = np.array([1, 2, 3, 4])
    assert metrics.kendall_tau_distance(truth, truth) == 0
    assert metrics.kendall_tau_distance(-truth, truth) == 1
    # one discordant pair of six: tau = (5 - 1) / 6, distance = 1/6
    assert metrics.kendall_tau_distance(np.array([2, 1, 3, 4]), truth) == pytest.approx(1 / 6)
    assert metrics.fcfs_tau_distance(np.arange(500), seed=0) == pytest.approx(0.5, abs=0.03)


def test_average_precision_and_base_rate() -> None:
    y = np.array([1, 0, 1, 0])
    assert metrics.average_precision(y, np.array([0.9, 0.1, 0.8, 0.2])) == 1.0
    assert metrics.average_precision(y, np.full(4, 0.5)) == pytest.approx(0.5)  # base rate
    assert metrics.average_precision(np.ones(3), np.ones(3)) is None


def test_reliability_and_ece() -> None:
    y = np.array([0, 1, 1, 1])
    p = np.array([0.05, 0.95, 0.95, 0.95])
    rows = metrics.reliability(y, p, bins=10)
    assert [(r["count"], r["frequency"]) for r in rows] == [(1, 0.0), (3, 1.0)]
    # |0 - 0.05| x 1/4 + |1 - 0.95| x 3/4 = 0.05
    assert metrics.expected_calibration_error(y, p) == pytest.approx(0.05)
    assert metrics.brier(y, p) == pytest.approx(0.0025)
    assert metrics.mape(np.array([110.0]), np.array([100.0])) == pytest.approx(0.1)


def test_knn_weights_and_means() -> None:
    w = inverse_distance_weights(np.array([[1.0, 0.5]]), eps=0.0 + 1e-3)
    assert w[0] == pytest.approx([1000, 1 / 0.501])
    labels = np.array([[[1.0, np.nan], [0.0, np.nan]]])  # 1 query, k=2, 2 models
    got = weighted_means(labels, np.array([[3.0, 1.0]]), fallback=np.array([0.5, 0.25]))
    assert got[0] == pytest.approx([0.75, 0.25])  # (3 x 1 + 1 x 0) / 4; model 2: fallback


def test_knn_temperature_weights_the_nearest_most_and_is_bounded() -> None:
    sim = np.array([[0.95, 0.93, 0.6]])
    assert np.array_equal(neighbour_weights(sim, KnnSettings()),
                          inverse_distance_weights(sim, 1e-3))
    w = neighbour_weights(sim, KnnSettings(temperature=0.01))
    assert w[0] == pytest.approx([1.0, np.exp(-2), np.exp(-35)])
    for bad in ({"temperature": -0.1}, {"temperature": float("inf")},
                {"temperature": float("nan")}, {"k": 0}, {"eps": 0.0}):
        with pytest.raises(ValueError, match="KnnSettings"):
            KnnSettings(**bad)


def test_knn_band_pools_the_neighbours_near_the_nearest_equally() -> None:
    """Two queries: the band is measured from each one's own nearest neighbour."""
    sim = np.array([[0.97, 0.95, 0.93, 0.6], [0.80, 0.79, 0.70, 0.5]])
    w = neighbour_weights(sim, KnnSettings(band=0.05))
    assert w.tolist() == [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    got = weighted_means(np.array([[[1.0], [0.0], [1.0], [0.0]]]), w[:1], np.array([0.5]))
    assert got[0, 0] == pytest.approx(2 / 3)  # the three in the band, equally
    for bad in ({"band": -0.1}, {"band": float("nan")}, {"band": float("inf")},
                {"band": 0.05, "temperature": 0.01}):
        with pytest.raises(ValueError, match="KnnSettings"):
            KnnSettings(**bad)


def test_knn_means_over_labels_split_at_load_are_the_same() -> None:
    """The estimator splits its label tables once (values, known mask) and gathers both:
    bit for bit the means of the gathered NaN table, on random tables with gaps."""
    rng = np.random.default_rng(0)
    table = rng.normal(100, 50, size=(300, 3))
    table[rng.random(table.shape) < 0.3] = np.nan
    table[:5] = np.nan  # rows no model has
    idx = rng.integers(0, 300, size=(40, 10))
    idx[0] = np.arange(5).repeat(2)  # a query whose neighbours know nothing
    w = inverse_distance_weights(rng.random((40, 10)), 1e-3)
    fallback = np.nan_to_num(np.nanmean(table, axis=0))
    values, known = np.nan_to_num(table), ~np.isnan(table)
    split = known_weighted_means(values[idx], known[idx], w, fallback)
    assert np.array_equal(split, weighted_means(table[idx], w, fallback))
    assert np.array_equal(split[0], fallback)


def test_semantic_router_loss_and_bias_init() -> None:
    assert logit(np.array([0.5]))[0] == 0
    logits = torch.tensor([[0.0, 5.0]])
    labels = torch.tensor([[1.0, float("nan")]])
    assert masked_bce(logits, labels).item() == pytest.approx(np.log(2))  # NaN ignored


def test_coarse_features() -> None:
    assert language("How many apples?") == "latin"
    assert language("Сколько яблок у Маши?") == "cyrillic"
    assert language("苹果有多少个？") == "cjk"
    assert task_type("def f(x):\n    return x") == "code"
    assert task_type("Solve 3 + 4 = ?") == "math"
    assert task_type("Tell me about your day") == "chat"
    assert [length_bucket(n, 5) for n in (0, 1, 3, 100, 10**6)] == [0, 1, 2, 4, 4]


def test_held_out_is_a_seeded_hash() -> None:
    ids = [f"p{i}" for i in range(2000)]
    share = np.mean([held_out(i, 0, 0.2) for i in ids])
    assert share == pytest.approx(0.2, abs=0.03)
    assert [held_out(i, 0, 0.2) for i in ids] == [held_out(i, 0, 0.2) for i in ids]
    assert [held_out(i, 0, 0.2) for i in ids] != [held_out(i, 1, 0.2) for i in ids]


def snap(seq: int, ts: float, step: int, batch: int = 4, heartbeat: bool = False
         ) -> SchedulerSnapshot:
    return SchedulerSnapshot(engine_id="e", seq=seq, ts=ts, step=step, batch_size=batch,
                             num_waiting=0, queued_prefill_tokens=7,
                             pending_decode_tokens=100, kv_usage=0.25, num_preemptions=0,
                             heartbeat=heartbeat)


def test_tpot_samples_from_telemetry() -> None:
    assert tpot_ms(snap(0, 10.0, 0), snap(1, 10.1, 4)) == pytest.approx(25.0)
    rows = samples([snap(0, 10.0, 0), snap(1, 10.1, 4),      # 25 ms
                    snap(2, 11.0, 4, heartbeat=True),          # skipped, bridges 1 -> 3
                    snap(3, 11.1, 8),                          # (11.1 - 10.1) / 4 = 250 ms
                    snap(5, 11.2, 9),                          # seq 4 lost: no sample
                    snap(6, 11.3, 10, batch=0)])               # idle: no sample
    assert [round(r.tpot_ms) for r in rows] == [25, 250]
    assert (rows[0].batch_size, rows[0].context_tokens, rows[0].kv_usage) == (4, 7, 0.25)
