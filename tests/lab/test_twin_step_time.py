"""The twin's step-time model: the profile file read and validated, the formula's
interpolation and extrapolation, and jitter with the measured spread."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

pytest.importorskip("vllm")  # the helpers build engine twins too

from kernels_bench.lab.twin.step_time import EngineProfile, StepTimeModel, load_profile
from tests.lab.twin_helpers import profile_dict, write_profile

CELLS = [(1, 128, 10.0, 10.0, 10.0), (8, 128, 24.0, 24.0, 24.0),
         (1, 2048, 20.0, 20.0, 20.0), (8, 2048, 48.0, 48.0, 48.0)]
"""Contexts 128 and 2048 with 128 decode tokens: the model places them at 192 and 2112."""


def test_formula(tmp_path: Path) -> None:
    m = StepTimeModel(write_profile(tmp_path / "p.json", CELLS, prefill_ms_per_token=0.5))
    assert m.decode_ms(1, 192) == (10.0, 0.0)
    assert m.decode_ms(8, 2112)[0] == 48.0
    assert m.decode_ms(4, 192)[0] == pytest.approx(16.0)    # 3/7 of the way in batch
    assert m.decode_ms(1, 1152)[0] == pytest.approx(15.0)   # halfway in context
    assert m.decode_ms(15, 192)[0] == pytest.approx(38.0)   # batch beyond 8: extended
    assert m.decode_ms(1, 0)[0] == pytest.approx(10.0 - 10.0 * 192 / 1920)
    # two decodes at contexts 100 and 284 (mean 192), plus 300 prompt tokens
    assert m.step_ms([100, 284], 300) == pytest.approx(10.0 + 14.0 / 7 + 0.5 * 300)
    assert m.step_ms([], 40) == pytest.approx(20.0)  # prefill only: no decode term


def test_jitter_follows_the_measured_spread(tmp_path: Path) -> None:
    cells = [(1, 128, 10.0, 8.0, 12.5), (8, 128, 20.0, 16.0, 25.0)]
    profile = write_profile(tmp_path / "p.json", cells, prefill_ms_per_token=0.0)
    m = StepTimeModel(profile, jitter=True, seed=5)
    samples = np.array([m.step_ms([200], 0) for _ in range(20_000)])
    p10, p50, p90 = np.percentile(samples, [10, 50, 90])
    assert p50 == pytest.approx(10.0, rel=0.02)
    assert (p10, p90) == (pytest.approx(8.0, rel=0.03), pytest.approx(12.5, rel=0.03))
    again = StepTimeModel(profile, jitter=True, seed=5)
    assert [again.step_ms([200], 0) for _ in range(5)] == samples[:5].tolist()
    assert StepTimeModel(profile).step_ms([200], 0) == 10.0  # jitter off: the median


def test_profile_file_is_validated(tmp_path: Path) -> None:
    good = profile_dict(CELLS, 0.5)
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**good, "machine": {"platform": "x"}}))
    assert load_profile(path).prefill_ms_per_token == 0.5  # other fields ignored
    for broken, field in (({**good, "decode_curve": []}, "decode_curve"),
                          ({k: v for k, v in good.items() if k != "decode_tokens"},
                           "decode_tokens"),
                          ({**good, "prefill_ms_per_token": -1}, "prefill_ms_per_token")):
        path.write_text(json.dumps(broken))
        with pytest.raises(msgspec.ValidationError, match=field):
            load_profile(path)
    dup = msgspec.convert(profile_dict([CELLS[0], CELLS[0]], 0.5), EngineProfile)
    with pytest.raises(ValueError, match="two decode cells"):
        StepTimeModel(dup)


def test_prefill_attention_term(tmp_path: Path) -> None:
    """A x sum n (c + n / 2) on top of P x n; a profile without A is linear as before."""
    linear = StepTimeModel(write_profile(tmp_path / "p.json", CELLS, prefill_ms_per_token=0.5))
    assert linear.prefill_attention_ms_per_pair == 0.0
    assert linear.step_ms([], 100, 100 * (900 + 50)) == pytest.approx(50.0)
    path = tmp_path / "a.json"
    path.write_text(json.dumps({**profile_dict(CELLS, 0.5),
                                "prefill_attention_ms_per_pair": 1e-4}))
    m = StepTimeModel(load_profile(path))
    # 100 new tokens on 900 cached: each attends to 950 keys on average
    assert m.step_ms([], 100, 100 * (900 + 50)) == pytest.approx(50.0 + 1e-4 * 95_000)
    assert m.step_ms([192], 0) == linear.step_ms([192], 0) == pytest.approx(10.0)
