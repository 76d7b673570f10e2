"""``kernels_bench.lab.studies.frontier_gap``: scores, big shares, the random-mix curve and
pooling runs, on hand-made replay outputs whose every number is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_bench.lab.studies import frontier_gap as gap


MIX_LO, MIX_HI = 'random_mix:fcfs@share=0.2', 'random_mix:fcfs@share=0.8'


def write_run(folder: Path, rows: dict[str, list[tuple[str, float, list[str]]]]) -> Path:
    """``rows``: per policy, one (problem, score, models of its calls) per workflow."""
    folder.mkdir()
    wfs, reqs = [], []
    for policy, workflows in rows.items():
        for i, (problem, score, models) in enumerate(workflows):
            job = f"w{i:04d}"
            wfs.append({"policy": policy, "rate": 3.0, "repeat": 0, "fold": 0, "job_id": job,
                        "problem_id": problem, "score": score, "arrival_s": 0.0,
                        "end_s": 2.0, "output_tokens": 100, "error": None})
            reqs += [{"policy": policy, "rate": 3.0, "repeat": 0, "fold": 0, "job_id": job,
                      "model": m} for m in models]
    (folder / "workflows.jsonl").write_text("".join(json.dumps(w) + "\n" for w in wfs))
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return folder


def rows(big_calls: list[int], scores: list[float]) -> list[tuple[str, float, list[str]]]:
    return [(f"P{i % 2}", s, ["big"] * b + ["small"] * (2 - b))
            for i, (b, s) in enumerate(zip(big_calls, scores))]


def _no_nan(name: str) -> None:
    raise AssertionError(f"{name} in the JSON table: not standard JSON")


def test_pooled_runs_give_the_mean_share_and_the_gap_to_the_mix_curve(tmp_path: Path) -> None:
    # mixes at big shares 0.25 and 0.75 scoring 0.4 and 0.8; the policy at 0.5 scores
    # 0.7 in one run and 0.9 in the other: pooled 0.8, the curve there 0.6, gap +20 points
    runs = [write_run(tmp_path / f"seed{k}", {
        MIX_LO: rows([1, 0, 0, 1], [0.4] * 4), MIX_HI: rows([2, 1, 2, 1], [0.8] * 4),
        "vllm:fcfs": rows([1, 1, 1, 1], [0.5] * 4),
        "cascade:fcfs": rows([2, 0, 2, 0], [score] * 4)}) for k, score in ((0, 0.7), (1, 0.9))]
    out, png = tmp_path / "table.json", tmp_path / "frontier.png"
    gap.main([*map(str, runs), "--pool", "--big", "big", "--boot", "50", "--json", str(out),
              "--plot", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = {r["policy"]: r for r in json.loads(out.read_text(), parse_constant=_no_nan)}
    assert {r["run"] for r in table.values()} == {"pooled"}
    assert table[MIX_LO]["minus_mix_curve"] == {"value": None, "lo": None, "hi": None}
    row = table["cascade:fcfs"]
    assert row["workflows"] == 8 and row["big_share"]["value"] == pytest.approx(0.5)
    assert row["score"]["value"] == pytest.approx(80.0)
    assert row["minus_mix_curve"]["value"] == pytest.approx(20.0)
    assert row["score_minus_baseline"]["value"] == pytest.approx(30.0)
    assert row["e2e_ratio"]["value"] == pytest.approx(1.0)
    # without --pool: one row per run, each against the first run's baseline
    gap.main([*map(str, runs), "--big", "big", "--boot", "50", "--json", str(out)])
    per_run = {(r["run"], r["policy"]): r for r in json.loads(out.read_text())}
    assert per_run["seed1", "cascade:fcfs"]["minus_mix_curve"]["value"] == pytest.approx(30.0)
    assert per_run["seed0", "cascade:fcfs"]["score_minus_baseline"]["value"] == pytest.approx(20.0)


def test_runs_pooled_per_seed_group_compare_one_groups_policy_with_anothers(
        tmp_path: Path) -> None:
    # the same policy label in two artifact sets (a, b), two seeds each: pooled per set,
    # b's policy against a's (0.6 and 0.7 in a, 0.8 and 0.9 in b: +20 points)
    runs = [write_run(tmp_path / f"{group}-seed{k}", {
        "vllm:fcfs": rows([1, 1, 1, 1], [0.5] * 4), "chimera:stjf": rows([2, 0, 2, 0], [sc] * 4)})
        for group, scores in (("a", (0.6, 0.7)), ("b", (0.8, 0.9))) for k, sc in enumerate(scores)]
    out = tmp_path / "table.json"
    gap.main([*map(str, runs), "--pool-seeds", "--baseline", "a:chimera:stjf", "--big", "big",
              "--boot", "50", "--json", str(out)])
    table = {(r["run"], r["policy"]): r for r in json.loads(out.read_text())}
    assert set(table) == {(g, pol) for g in "ab" for pol in ("vllm:fcfs", "chimera:stjf")}
    row = table["b", "chimera:stjf"]
    assert row["workflows"] == 8 and row["score"]["value"] == pytest.approx(85.0)
    assert row["score_minus_baseline"]["value"] == pytest.approx(20.0)
    assert table["a", "chimera:stjf"]["score_minus_baseline"]["value"] == pytest.approx(0.0)
    with pytest.raises(SystemExit):
        gap.main([*map(str, runs), "--pool", "--pool-seeds"])


def test_a_folder_that_is_no_replay_output_is_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        gap.main([str(tmp_path)])
    assert "not a replay's output" in capsys.readouterr().err


def test_an_output_in_a_missing_folder_is_one_line_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "run", {"vllm:fcfs": rows([1, 1], [0.5, 0.5])})
    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit):
            gap.main([str(run), "--big", "big", flag, str(tmp_path / "absent" / "out")])
        assert f"{flag} {tmp_path / 'absent' / 'out'}: no folder" in capsys.readouterr().err
