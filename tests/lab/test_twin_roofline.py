"""The roofline step-time model: a hand-computed case, the crossover from bandwidth- to
compute-bound, the modelled file read by the twin, parameter counts, clear errors.

Hand-computed case (``TINY``, ``ROUND``): hidden 64, 4 heads of 16 (4 KV heads), 2 layers,
intermediate 128, vocab 1,000, tied embeddings, bfloat16.

- parameters per layer: q, k, v, o 4 x 64 x 64 = 16,384; MLP 3 x 64 x 128 = 24,576;
  norms 128; 41,088 x 2 layers = 82,176; + final norm 64 + embedding 64,000 = 146,240;
- weight bytes 2 x 146,240 = 292,480; KV bytes per token 2 x 2 x 4 x 16 x 2 = 512;
- per step: bytes = 292,480 + 512 b c, FLOPs = b (292,480 + 512 c) (2 x params per token,
  4 x 2 layers x 64 = 512 per context token);
- ROUND: 1 GB/s, 100 GFLOP/s, efficiencies 1, overhead 1 ms. At c = 0 memory time is
  292.48 us for any b, compute time b x 2.9248 us: equal at b = 100, the crossover.
  b = 1, c = 0: 1.29248 ms; b = 1, c = 100: 1 + 0.34368 = 1.34368 ms (bandwidth-bound);
  b = 200, c = 0: 1 + 200 x 0.0029248 = 1.58496 ms (compute-bound);
- prefill slope at 1,024 tokens: (2 x 146,240 x 1,024 + 512 x 1,024 x 1,025 / 2) FLOPs
  = 568,197,120 / 1e11 s = 5.6819712 ms / 1,024 = 0.0055488 ms per token.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kernels_bench.lab.twin import roofline
from kernels_bench.lab.twin.roofline import GpuPreset, floor_seconds, model_shape, step_seconds
from kernels_bench.lab.twin.step_time import StepTimeModel, load_profile
from kernels_bench.lib.model_config import model_config

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
        "vocab_size": 1000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}
ROUND = GpuPreset("round", hbm_bytes_per_s=1e9, bf16_flops=1e11, memory_bytes=1e9,
                  bw_efficiency=1.0, flops_efficiency=1.0, step_overhead_s=1e-3)


def test_hand_computed_shape_and_step() -> None:
    s = model_shape(TINY)
    assert (s.params, s.kv_bytes_per_token) == (146_240, 512)
    assert step_seconds(s, ROUND, 1, 0) == pytest.approx(1.29248e-3)
    assert step_seconds(s, ROUND, 1, 100) == pytest.approx(1.34368e-3)
    assert floor_seconds(s, ROUND, 1, 100) == pytest.approx(0.34368e-3)  # no overhead
    assert step_seconds(s, ROUND, 200, 0) == pytest.approx(1.58496e-3)
    half_bw = replace(ROUND, bw_efficiency=0.5)
    assert step_seconds(s, half_bw, 1, 100) == pytest.approx(1e-3 + 2 * 0.34368e-3)
    # tensor parallelism halves bytes and FLOPs (all-reduce left out)
    assert step_seconds(s, ROUND, 1, 100, tp=2) == pytest.approx(1e-3 + 0.34368e-3 / 2)
    assert roofline.prefill_ms_per_token(s, ROUND, 1024) == pytest.approx(0.0055488)
    # a 1,024-token prompt alone is compute-bound: 1 + 5.6819712 ms
    assert step_seconds(s, ROUND, 0, 0, prefill_tokens=1024) == pytest.approx(6.6819712e-3)


def test_crossover_from_bandwidth_to_compute_bound() -> None:
    s = model_shape(TINY)
    flat = [step_seconds(s, ROUND, b, 0) for b in (1, 50, 100)]
    assert flat == pytest.approx([1.29248e-3] * 3)  # bandwidth-bound: batch is free
    assert step_seconds(s, ROUND, 101, 0) == pytest.approx(1e-3 + 101 * 2.9248e-6)
    assert step_seconds(s, ROUND, 101, 0) > flat[-1]


def test_modelled_file_drives_the_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    monkeypatch.setitem(roofline.GPU_PRESETS, "round", ROUND)
    file = roofline.modelled_file(str(tmp_path / "tiny"), "round", "tiny",
                                  batch_sizes=(1, 100, 200), contexts=(0, 100))
    measured_keys = {"engine", "entry", "model", "served_model_name", "decode_ms_per_token",
                     "max_batch_size", "reference_context", "decode_tokens",
                     "prefill_ms_per_token", "prefill_fixed_ms", "kv_capacity_tokens",
                     "max_num_seqs", "decode_curve", "skipped", "prefill_curve", "machine"}
    assert measured_keys <= set(file)
    # 0.9 x 1 GB - 292,480 weight bytes, over 512 bytes per token
    assert file["kv_capacity_tokens"] == (900_000_000 - 292_480) // 512
    (tmp_path / "tiny.json").write_text(json.dumps(file))
    profile = load_profile(tmp_path / "tiny.json")
    assert profile.modelled == "roofline round"
    m = StepTimeModel(profile)
    assert m.step_ms([100], 0) == pytest.approx(1.34368)
    assert m.step_ms([0] * 200, 0) == pytest.approx(1.58496)
    assert m.step_ms([0], 1024) == pytest.approx(1.29248 + 1024 * 0.0055488)
    assert roofline.modelled_profile(str(tmp_path / "tiny"), "round", batch_sizes=(1, 100, 200),
                                     contexts=(0, 100)) == profile


def test_parameter_counts_of_the_shape_twins() -> None:
    """The published parameter counts of the real models."""
    def params(name: str) -> int:
        return model_shape(model_config(f"builtin:{name}", Path())).params

    assert params("qwen2.5-1.5b-shape") == 1_543_714_304
    assert params("qwen2.5-0.5b-shape") == 494_032_768
    assert params("smollm2-135m-shape") == 134_515_008


def test_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="known presets are h100-sxm, h200, a100-80gb"):
        roofline.modelled_file("builtin:tiny-a", "v100", "a")
    with pytest.raises(ValueError, match="built-in models are builtin:tiny-a"):
        roofline.modelled_file("builtin:nope", "l4", "a")
    with pytest.raises(ValueError, match="16-bit"):
        model_shape(TINY, "float32")
    with pytest.raises(SystemExit):
        roofline.main(["--model", "builtin:tiny-a", "--gpu", "v100", "--entry", "a",
                       "--out", str(tmp_path / "a.json")])
    assert "GPU preset 'v100'" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()
