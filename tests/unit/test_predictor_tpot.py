"""Latency heads (RouteBalance 4.2): per-engine XGBoost TPOT from engine state, trained on
telemetry; beats the per-engine mean; save, reload, refuse unknown engines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from router.predictors.artifact import ArtifactError
from router.predictors.base import TpotQuery
from router.predictors.evaluation import regression_report
from router.predictors.kinds import split_rows
from router.predictors.records import Split
from router.predictors.loader import load_predictors
from router.predictors.sources import load_tpot_samples
from router.predictors.synthetic import step_ms
from router.predictors.tpot import TpotHeads, TpotSettings, read_telemetry_log
from tests.fixtures.predictors import TELEMETRY


def evaluate(heads: TpotHeads, rows: list) -> dict:
    est = np.array(heads.tpot_ms([TpotQuery(r.engine, r.batch_size, r.pending_decode_tokens,
                                            r.context_tokens, r.kv_usage) for r in rows]))
    return regression_report(est, np.array([r.tpot_ms for r in rows]),
                             [r.engine for r in rows])


def test_synthetic_engines(tmp_path: Path) -> None:
    train, test = split_rows(load_tpot_samples(["synthetic-telemetry:1500"]), Split(0, 0.2))
    heads = TpotHeads.train(train, TpotSettings(), progress=False)
    for engine, r in evaluate(heads, test).items():
        assert r["mape"] < 0.5 * r["mape_mean_baseline"], engine
    # the head learned the simulated law: step time grows with the batch
    small, big = heads.tpot_ms([TpotQuery("synthetic-large-0", b, 1000, 0, 0.2) for b in (2, 48)])
    assert big > small
    assert big == pytest.approx(step_ms("synthetic-large-0", 48, 0, 0.2), rel=0.25)
    heads.save(tmp_path, {"seed": 0, "holdout": 0.2})
    again = load_predictors({"tpot": str(tmp_path)}, [], engines=["synthetic-large-0"]).tpot
    q = [TpotQuery("synthetic-small-0", 8, 500, 100, 0.1)]
    assert again is not None and again.tpot_ms(q) == heads.tpot_ms(q)
    with pytest.raises(ArtifactError, match="also has big-0"):
        load_predictors({"tpot": str(tmp_path)}, [], engines=["big-0"])


def test_real_telemetry_fixture() -> None:
    """Real snapshots of builtin:tiny-b on this CPU: the head beats the engine's mean."""
    rows = load_tpot_samples([str(TELEMETRY)])
    train, test = split_rows(rows, Split(0, 0.2))
    assert len(train) > 100 and len(test) > 20
    r = evaluate(TpotHeads.train(train, TpotSettings(), progress=False), test)["tiny-b-0"]
    assert r["mae"] < r["mae_mean_baseline"]


def test_a_bad_telemetry_line_is_an_error_naming_it(tmp_path: Path) -> None:
    for bad in (b"not json\n", b'{"engine_id": "\xff"}\n', b"[1, 2]\n"):
        path = tmp_path / "t.jsonl"
        path.write_bytes(bad)
        with pytest.raises(ValueError, match="t.jsonl:1: not a scheduler snapshot"):
            read_telemetry_log(path)
