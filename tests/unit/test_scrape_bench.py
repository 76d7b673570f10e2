"""``python -m kernels_bench scrape`` at its smallest: one stand-in engine scraped, one
round of half-second windows. Checks the result's structure and that scrapes happened,
not timings (CI machines are noisy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_bench.commands import scrape
from kernels_bench.scrape.bench import run, table


def test_one_round_scrapes_and_reports() -> None:
    lines: list[str] = []
    result = run([1, 2], interval_ms=50, window_s=0.5, rounds=1, settle_s=0.1,
                 progress=lines.append)
    assert set(result) == {"settings", "machine", "rows", "parse", "windows"}
    assert [r["engines"] for r in result["rows"]] == [1, 2]
    windows = result["windows"]
    assert [(w["engines"], w["scraping"]) for w in windows] == [
        (1, True), (1, False), (2, True), (2, False)]
    for w in windows:
        assert w["wall_s"] > 0.4 and w["user_s"] + w["sys_s"] >= 0
        assert w["scrapes_failed"] == 0
        assert (w["scrapes_ok"] > 0) == w["scraping"]  # none while scraping is off
    for r in result["rows"]:
        assert r["rounds"] == 1 and r["ci95"] is None  # one round: no interval
        assert r["scrapes_per_s"] > 0 and r["target_per_s"] == 20
        assert r["verdict"].split(",")[0] in ("meets", "over", "unclear")
    p = result["parse"]
    assert p["body_bytes"] > 40_000 and p["parse_metrics_us"] > 0
    assert p["ratio"] == pytest.approx(p["prometheus_client_us"] / p["parse_metrics_us"])
    text = table(result)
    assert sum(ln.startswith("| ") for ln in text.splitlines()) == 3  # header, 2 rows
    assert "prometheus_client" in text
    assert any("round 1/1, scraping on" in ln for ln in lines)
    json.dumps(result)


def test_flags_are_checked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for bad in (["--engines", "0"], ["--interval-ms", "5"], ["--window-s", "0"],
                ["--body", str(tmp_path / "none.txt")]):
        with pytest.raises(SystemExit) as exc:
            scrape.main([*bad, "--out", str(tmp_path)])
        assert exc.value.code == 2
    assert not (tmp_path / "scrape.json").exists()
    assert "--interval-ms" in capsys.readouterr().err
