"""STJF against FCFS from the calls' queue times (``kernels_bench.lab.twin.queueing``), on
hand-made replay folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_bench.lab.twin import queueing


def _replay(folder: Path, seed: int, stjf_queue: float) -> Path:
    """Specs ``a:stjf``, ``a:fcfs``, ``oracle`` at rate 6, 20 two-stage workflows: every
    FCFS call queues 2 s (stage 1 of the fast engine, stage 2 of the slow one), every STJF
    call ``stjf_queue`` s at priority 100 x stage."""
    folder.mkdir(parents=True)
    requests, flows = [], []
    for policy, q in (("a:stjf", stjf_queue), ("a:fcfs", 2.0), ("oracle", stjf_queue)):
        for j in range(20):
            for stage in (0, 1):
                requests.append({"policy": policy, "rate": 6.0, "repeat": 0,
                                 "job_id": f"w{j:04d}", "stage_index": stage,
                                 "engine": ("fast", "slow")[stage], "queue_s": q,
                                 "priority": 100 * (stage + 1)})
            flows.append({"policy": policy, "rate": 6.0, "repeat": 0, "job_id": f"w{j:04d}",
                          "arrival_s": 0.0, "end_s": 10.0 + 2 * q, "error": None})
    for name, rows in (("requests", requests), ("workflows", flows)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps({"meta": {
        "baseline": "a:fcfs", "seed": seed, "workflows": 20}, "runs": []}))
    return folder


def test_queue_and_e2e_ratios_pair_by_workflow_and_pool_seeds(tmp_path: Path) -> None:
    a, b = _replay(tmp_path / "s0", 0, 1.0), _replay(tmp_path / "s1", 1, 2.0)
    one = queueing.analyse([a])
    assert [(r["stjf"], r["fcfs"]) for r in one] == [("a:stjf", "a:fcfs")]
    r = one[0]
    assert r["queue_s"] == {"stjf": 1.0, "fcfs": 2.0}
    assert r["queue_fcfs_over_stjf"]["value"] == pytest.approx(2.0)
    assert r["queue_fcfs_over_stjf"]["verdict"] == "finding"
    assert r["e2e_stjf_over_fcfs"]["value"] == pytest.approx(12 / 14)
    assert r["fcfs_later_stage_share"] == 0.5 and r["fcfs_top_engine_share"] == 0.5
    assert r["stjf_queued_calls"] == 40
    assert r["stjf_queued_priority_p10_p50_p90"] == pytest.approx([100, 150, 200])
    both = queueing.analyse([a, b], [("oracle", "a:fcfs")])
    assert [(r["stjf"], r["repeats"]) for r in both] == [("a:stjf", 2), ("oracle", 2)]
    q = both[0]["queue_fcfs_over_stjf"]
    assert q["value"] == pytest.approx(2 * 2 / 3)  # 2 s / mean(1 s, 2 s)
    assert q["low"] == pytest.approx(1.0) and q["high"] == pytest.approx(2.0)
    assert "**" not in queueing.table(both).splitlines()[2].split("|")[5]  # unresolved


def test_calls_without_queue_times_are_refused(tmp_path: Path) -> None:
    folder = _replay(tmp_path / "live", 0, 1.0)
    rows = (folder / "requests.jsonl").read_text().replace('"queue_s": 1.0', '"queue_s": null')
    (folder / "requests.jsonl").write_text(rows)
    with pytest.raises(SystemExit, match="no queue_s"):
        queueing.main([str(folder)])
