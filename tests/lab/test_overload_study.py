"""``kernels_bench.lab.studies.overload`` (issue 61): Chimera's best point against vLLM's
balancer, the factor and the points, on hand-made twin outputs whose numbers are known.

vLLM's balancer: every workflow 2 s for 100 tokens (20 ms per token), score 0.5. Two
Chimera slack points: 1 s (10 ms per token, 2.0x faster) scoring 0.7, and 1.6 s scoring
0.8. The best point is the faster one: factor 2.0, +20 points; the figure is a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_bench.lab.studies import overload


def write_run(folder: Path, rows: dict[str, tuple[float, float]]) -> Path:
    """``rows``: per policy, (E2E s, score) of each of 6 workflows on problems P0-P2."""
    folder.mkdir()
    wfs, reqs = [], []
    for policy, (e2e, score) in rows.items():
        for i in range(6):
            job = f"w{i}"
            wfs.append({"policy": policy, "rate": 50.0, "repeat": 0, "fold": 0, "job_id": job,
                        "problem_id": f"P{i % 3}", "score": score, "arrival_s": 1.0,
                        "end_s": 1.0 + e2e, "output_tokens": 100, "error": None})
            reqs.append({"policy": policy, "rate": 50.0, "repeat": 0, "fold": 0,
                         "job_id": job, "model": "big" if i % 2 else "small"})
    (folder / "workflows.jsonl").write_text("".join(json.dumps(w) + "\n" for w in wfs))
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return folder


def test_best_point_factor_and_points(tmp_path: Path) -> None:
    run = write_run(tmp_path / "s-r50", {"vllm:fcfs": (2.0, 0.5),
                                         "chimera:stjf@tau=0.25": (1.0, 0.7),
                                         "chimera:stjf": (1.6, 0.8),
                                         "random_mix:fcfs@share=0.5": (1.5, 0.6)})
    out, png, md = tmp_path / "o.json", tmp_path / "o.png", tmp_path / "o.md"
    overload.main([f"S=big:{run}", "--boot", "50", "--json", str(out), "--plot", str(png),
                   "--table", str(md)])
    rows = json.loads(out.read_text())["S"]
    b = overload.best(rows)
    assert b["policy"] == "chimera:stjf@tau=0.25"
    assert b["e2e_per_token_ratio"]["value"] == pytest.approx(0.5)
    assert b["score_minus_baseline"]["value"] == pytest.approx(20.0)
    text = md.read_text()
    assert "| S | 50 | chimera:stjf@tau=0.25 | 20.0 [20.0, 20.0] | 10.0 [10.0, 10.0] | 2.00 [2.00, 2.00]x | +20.0" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
