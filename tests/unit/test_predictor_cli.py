"""``python -m router.train`` / ``router.evaluate`` end to end on the SYNTHETIC fixture, and
the predictor latency benchmark on a tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels_bench.commands import predictors as predictors_command
from router import evaluate, train
from tests.fixtures.predictors import SYNTHETIC


def test_train_then_evaluate_writes_report_and_plot(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    art = tmp_path / "length"
    train.main(["length", "--data", str(SYNTHETIC), "--out", str(art), "--quiet",
                "--set", "n_estimators=20"])
    meta = json.loads((art / "metadata.json").read_text())
    assert meta["data"]["sources"] == ["synthetic.jsonl.gz"]
    assert meta["data"]["fingerprint"].startswith("sha256:")
    assert meta["train_settings"]["n_estimators"] == 20
    evaluate.main(["length", "--data", str(SYNTHETIC), "--artifact", str(art)])
    report = json.loads((art / "evaluation.json").read_text())
    assert report["evaluation_data"]["same_data_as_training"] is True
    tau = report["metrics"]["all_stages"]
    assert tau["kendall_tau_distance"] < tau["fcfs"]
    assert report["papers"]["Chimera Table 3"] == {"min": 0.12, "max": 0.27}
    assert (art / "evaluation.png").read_bytes()[:4] == b"\x89PNG"
    assert "kendall_tau_distance" in capsys.readouterr().out


def test_bad_settings_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        train.main(["length", "--data", str(SYNTHETIC), "--out", "unused",
                    "--set", "trees=5"])
    assert "KEY one of tokenizer, svd_components" in capsys.readouterr().err


def test_predictor_bench_tiny_run(tmp_path: Path) -> None:
    art = tmp_path / "capability"
    train.main(["capability", "--data", str(SYNTHETIC), "--out", str(art), "--quiet"])
    out = tmp_path / "bench"
    predictors_command.main(["--artifact", f"capability={art}", "--data", str(SYNTHETIC),
                          "--batches", "1,4", "--repeats", "2", "--out", str(out)])
    results = json.loads((out / "predictors.json").read_text())["results"]["capability"]
    assert set(results) == {"1", "4"}
    assert results["4"]["service"]["samples"] == 8 and results["4"]["alone"]["p50_ms"] > 0
    assert (out / "predictors.png").exists()
