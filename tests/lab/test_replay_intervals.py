"""Known-answer tests of the replay's intervals (kernels_bench.lab.replay.intervals)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernels_bench.lab.replay import intervals as iv
from kernels_bench.lab.replay.report import interval_tables, observations


def records(policy: str, e2e: np.ndarray, score: np.ndarray, rate: float = 1.0
            ) -> list[dict[str, Any]]:
    """Workflow records with E2E ``e2e[repeat, workflow]`` and 100 output tokens each."""
    return [{"policy": policy, "rate": rate, "repeat": r, "job_id": f"w{j:03d}",
             "problem_id": f"p{j}", "workflow": "solve", "num_stages": 1, "arrival_s": 1.0,
             "end_s": 1.0 + float(e2e[r, j]), "score": float(score[r, j]),
             "output_tokens": 100, "error": None}
            for r in range(e2e.shape[0]) for j in range(e2e.shape[1])]


RNG = np.random.default_rng(3)
BASE = RNG.exponential(10.0, (3, 60))
SCORES = RNG.integers(0, 2, (3, 60)).astype(float)


def test_a_constant_ratio_is_found_exactly() -> None:
    out = iv.summarize(records("fast", BASE / 2, SCORES) + records("base", BASE, SCORES),
                       baseline="base")
    (c,) = out["comparisons"]
    assert (c["policy"], c["against"]) == ("fast", "base")
    for key in ("e2e_s.mean", "e2e_s.p95", "e2e_per_token_s.mean"):
        assert c[key]["value"] == pytest.approx(0.5)
        assert c[key]["low"] == pytest.approx(0.5) and c[key]["high"] == pytest.approx(0.5)
        assert c[key]["verdict"] == "finding"
    assert c["score"]["value"] == 0.0 and c["score"]["verdict"] == "unresolved"


def test_the_value_is_the_pooled_mean_and_its_interval_covers_it() -> None:
    out = iv.summarize(records("base", BASE, SCORES), baseline="base")
    (row,) = out["values"]
    e = row["e2e_s.mean"]
    assert e["value"] == pytest.approx(BASE.mean())
    assert e["low"] < e["value"] < e["high"]
    assert row["score"]["value"] == pytest.approx(100 * SCORES.mean())
    assert row["repeats"] == 3


def test_no_difference_is_unresolved_and_a_clear_one_is_a_finding() -> None:
    same = BASE * RNG.lognormal(0.0, 0.3, BASE.shape)  # noise around the baseline
    better = 100 * np.ones_like(SCORES)
    out = iv.summarize(records("same", same, SCORES) + records("sure", BASE * 0.6, better)
                       + records("base", BASE, SCORES), baseline="base")
    by = {c["policy"]: c for c in out["comparisons"]}
    assert by["same"]["e2e_s.mean"]["verdict"] == "unresolved"
    assert by["same"]["e2e_s.mean"]["low"] < 1 < by["same"]["e2e_s.mean"]["high"]
    assert by["sure"]["e2e_s.mean"]["verdict"] == "finding"
    assert by["sure"]["score"]["verdict"] == "finding"
    assert by["sure"]["score"]["low"] > 0


def test_failed_workflows_are_left_out_and_comparisons_are_paired() -> None:
    rows = records("a", BASE, SCORES) + records("base", BASE, SCORES)
    rows[0]["error"] = "boom"
    out = iv.summarize(rows, baseline="base")
    (c,) = out["comparisons"]
    assert c["e2e_s.mean"]["value"] == pytest.approx(
        np.delete(BASE.ravel(), 0).mean() / BASE.mean())
    with pytest.raises(ValueError, match="unpaired"):
        iv.compare(BASE, BASE[:, :10])


def test_results_text_marks_findings_and_unresolved() -> None:
    rows = (records("chimera:stjf", BASE * 0.6, SCORES) + records("vllm:fcfs", BASE, SCORES))
    summary = {"meta": {"baseline": "vllm:fcfs", "rates": [1.0]},
               "intervals": iv.summarize(rows, "vllm:fcfs")}
    table = interval_tables(summary)
    assert "| chimera:stjf | vllm:fcfs | 1 | **0.60x [0.60, 0.60]** |" in table
    assert "+0.0 [+0.0, +0.0] unresolved" in table
    (fact,) = observations(summary)
    assert "E2E mean ratio 0.60x [0.60, 0.60] (finding)" in fact
    assert "score difference +0.0 points [+0.0, +0.0] (unresolved)" in fact


def test_comparisons_wait_for_both_sides() -> None:
    """A replay writes its summary after every run: before the baseline ran, there is
    nothing to compare with it."""
    out = iv.summarize(records("chimera:stjf", BASE, SCORES), baseline="vllm:fcfs",
                       named=[("chimera:stjf", "chimera:fcfs")])
    assert out["comparisons"] == [] and len(out["values"]) == 1


def test_cross_fitted_repeats_are_resampled_per_fold() -> None:
    fold_of = np.array([0, 0, 0, 1, 1, 1])
    ri, wi = iv._draws((4, 6), 5, fold_of)
    assert ri.shape == (iv.BOOTSTRAP_DRAWS, 4, 6) and wi.shape == (iv.BOOTSTRAP_DRAWS, 1, 6)
    drawn_fold = fold_of[wi[:, 0, :]]  # (draws, jobs): the fold of each drawn workflow
    for d in range(50):
        for f in (0, 1):
            cols = ri[d][:, drawn_fold[d] == f]
            assert (cols == cols[:, :1]).all()  # one repeat draw per fold and draw
    both = [d for d in range(iv.BOOTSTRAP_DRAWS) if len(set(drawn_fold[d])) == 2]
    differ = [d for d in both if not (ri[d][:, drawn_fold[d] == 0][:, 0]
                                      == ri[d][:, drawn_fold[d] == 1][:, 0]).all()]
    assert len(differ) > 0.9 * len(both)  # the folds' repeats are drawn independently
    one, _ = iv._draws((4, 6), 5)
    assert one.shape == (iv.BOOTSTRAP_DRAWS, 4, 1)  # without folds: as before


def test_a_cross_fitted_summary_pools_the_folds() -> None:
    rows = []
    for fold in (0, 1):  # each fold its own jobs, as the replay numbers them
        for policy, scale in (("a", 0.5), ("base", 1.0)):
            part = records(policy, BASE[:, :30] * scale, SCORES[:, :30])
            for r in part:
                r["job_id"] = f"w{30 * fold + int(r['job_id'][1:]):03d}"
                r["fold"] = fold
            rows += part
    out = iv.summarize(rows, baseline="base")
    (c,) = out["comparisons"]
    assert c["e2e_s.mean"]["low"] == pytest.approx(0.5) == c["e2e_s.mean"]["high"]
    (_, base) = out["values"]
    assert base["e2e_s.mean"]["value"] == pytest.approx(BASE[:, :30].mean())
    assert list(iv.strata({"w1": 3, "w0": 7, "w2": 3}, ["w0", "w1", "w2"])) == [1, 0, 0]


def test_excluded_problem_lists_are_checked(tmp_path: Any) -> None:
    from kernels_bench.lab.replay.results import problem_list

    (tmp_path / "ok.json").write_text('["math-1", "code-2"]')
    assert problem_list(tmp_path / "ok.json") == {"math-1", "code-2"}
    for name, text in (("obj.json", '{"a": 1}'), ("nums.json", "[1, 2]"), ("bad.json", "[")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"--exclude-problems .*{name}"):
            problem_list(tmp_path / name)
    with pytest.raises(ValueError, match="missing.json"):
        problem_list(tmp_path / "missing.json")
