"""Modelled GPU engine profiles: a roofline step-time model (no GPU measured).

``modelled_profile`` writes what ``python -m kernels_bench profile`` measures on a real
engine (``<entry>.json``, the file ``step_time.load_profile`` reads), but every step time
comes from ``step_seconds``: weight and KV bytes over memory bandwidth, FLOPs over peak,
plus a fixed per-step overhead, for a named GPU preset and the model's shape from its
``config.json``. The file says so (``"modelled": "roofline <preset>"``); a measured file
of the same entry replaces it with no other change. docs/research/twin.md, "Modelled GPU profiles".

CLI: ``python -m kernels_bench.lab.twin.roofline --model builtin:NAME|PATH --gpu h100-sxm
[--tp N] --entry NAME --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from kernels_bench.lab.twin.step_time import EngineProfile
from kernels_bench.lib.model_config import DTYPE_BYTES, kv_bytes_per_token, model_config
from kernels_bench.predictors.profile import Cell, profile_numbers

BW_EFFICIENCY = 0.8
"""Assumed achievable fraction of datasheet HBM bandwidth for the weight and KV reads of a
decode step (memory-bound kernels commonly reach 70-90% of it; not measured here)."""
FLOPS_EFFICIENCY = 0.6
"""Assumed achievable fraction of the datasheet dense BF16 peak for the step's matmuls and
attention (an assumption, not measured here)."""
STEP_OVERHEAD_S = 1e-3
"""Assumed fixed cost of every engine step, 1 ms: vLLM's CPU-side scheduling, input
preparation, kernel launches (CUDA graphs) and sampling not hidden behind the GPU work.
An assumption, not measured here; it dominates small models at small batches."""
GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``--gpu-memory-utilization``: the share of GPU memory for weights + KV."""
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (128, 512, 2048, 8192)


@dataclass(frozen=True)
class GpuPreset:
    """One GPU: datasheet peaks, assumed achievable fractions, per-step overhead."""

    name: str
    hbm_bytes_per_s: float
    """Datasheet memory bandwidth."""
    bf16_flops: float
    """Datasheet dense (no sparsity) BF16 tensor-core peak."""
    memory_bytes: float
    """Datasheet memory size (sizes the KV cache: ``kv_capacity_tokens``)."""
    bw_efficiency: float = BW_EFFICIENCY
    flops_efficiency: float = FLOPS_EFFICIENCY
    step_overhead_s: float = STEP_OVERHEAD_S


GPU_PRESETS: dict[str, GpuPreset] = {p.name: p for p in (
    # NVIDIA H100 datasheet, SXM5 80 GB: 3.35 TB/s HBM3, 989 TFLOP/s BF16 dense (1,979 sparse)
    GpuPreset("h100-sxm", 3.35e12, 989e12, 80e9),
    # NVIDIA H200 datasheet, SXM 141 GB: 4.8 TB/s HBM3e, 989 TFLOP/s BF16 dense (1,979 sparse)
    GpuPreset("h200", 4.8e12, 989e12, 141e9),
    # NVIDIA A100 datasheet, 80 GB SXM: 2,039 GB/s HBM2e, 312 TFLOP/s BF16 dense
    GpuPreset("a100-80gb", 2.039e12, 312e12, 80e9),
    # NVIDIA A100 datasheet, 40 GB SXM: 1,555 GB/s HBM2, 312 TFLOP/s BF16 dense
    GpuPreset("a100-40gb", 1.555e12, 312e12, 40e9),
    # NVIDIA L4 datasheet: 300 GB/s GDDR6, 242 TFLOP/s BF16 with sparsity, ~121 dense; 24 GB
    GpuPreset("l4", 300e9, 121e12, 24e9),
)}


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a model, from its ``config.json``."""

    layers: int
    hidden: int
    q_dim: int
    """Attention heads x head size (the hidden size in Llama and Qwen2 models)."""
    params: int
    dtype_bytes: int
    kv_bytes_per_token: int
    """``engine_spec.kv_bytes_per_token``: 2 x layers x KV heads x head size x dtype bytes."""


def model_shape(config: dict[str, Any], dtype: str = "bfloat16") -> ModelShape:
    """The shape of a Llama- or Qwen2-style decoder. Parameters: embedding (and an untied
    LM head), per layer the q, k, v, o projections (with q/k/v biases when
    ``attention_bias`` or Qwen2), a gated MLP (3 x hidden x intermediate) and two norms,
    plus the final norm."""
    if dtype not in DTYPE_BYTES or DTYPE_BYTES[dtype] != 2:
        raise ValueError(f"dtype {dtype!r}: the presets' peaks are 16-bit "
                         "(bfloat16 or float16)")
    h, heads = config["hidden_size"], config["num_attention_heads"]
    head = config.get("head_dim") or h // heads
    q, kv = heads * head, config.get("num_key_value_heads", heads) * head
    bias = config.get("attention_bias", config.get("model_type") == "qwen2")
    layer = (h * q + 2 * h * kv + q * h + (q + 2 * kv if bias else 0)
             + 3 * h * config["intermediate_size"] + 2 * h)
    embed = config["vocab_size"] * h
    params = (config["num_hidden_layers"] * layer + h + embed
              + (0 if config.get("tie_word_embeddings", False) else embed))
    return ModelShape(layers=config["num_hidden_layers"], hidden=h, q_dim=q, params=params,
                      dtype_bytes=DTYPE_BYTES[dtype],
                      kv_bytes_per_token=kv_bytes_per_token(config, dtype))


def step_seconds(shape: ModelShape, gpu: GpuPreset, batch: int, context: float,
                 prefill_tokens: int = 0, tp: int = 1) -> float:
    """One engine step: ``batch`` requests decode a token at mean context ``context`` and
    ``prefill_tokens`` tokens of one fresh prompt are computed::

        t = overhead + max(bytes / (bw x eff_bw), flops / (peak x eff_flops))
        bytes = (params x dtype bytes  +  b x c x kv bytes per token) / tp
        flops = (2 x params x (b + n)  +  4 x layers x q_dim x (b x c + n (n + 1) / 2)) / tp

    Weights are read once per step; each decode token reads its c tokens of K and V;
    attention is 4 x layers x q_dim FLOPs per (query, key) pair (QK^T and PV), a prompt's
    token i attending to i keys. ``tp`` divides bytes and FLOPs evenly over the ranks; the
    all-reduces of tensor parallelism are left out. Also left out: the embedding lookup
    reads b rows, not the table (counted whole, as an untied LM head is)."""
    return gpu.step_overhead_s + floor_seconds(shape, gpu, batch, context, prefill_tokens, tp)


def floor_seconds(shape: ModelShape, gpu: GpuPreset, batch: int, context: float,
                  prefill_tokens: int = 0, tp: int = 1) -> float:
    """``step_seconds`` without the per-step overhead: the GPU work alone,
    ``max(bytes / (bw x eff_bw), flops / (peak x eff_flops))`` (what a measured floor,
    ``kernels_bench.lab.twin.floor``, is held against)."""
    nbytes, flops = _bytes_and_flops(shape, batch, context, prefill_tokens)
    memory_s = nbytes / tp / (gpu.hbm_bytes_per_s * gpu.bw_efficiency)
    compute_s = flops / tp / (gpu.bf16_flops * gpu.flops_efficiency)
    return max(memory_s, compute_s)


def _bytes_and_flops(shape: ModelShape, batch: int, context: float,
                     prefill_tokens: int) -> tuple[float, float]:
    """``step_seconds``'s bytes and FLOPs, before tensor parallelism."""
    nbytes = shape.params * shape.dtype_bytes + batch * context * shape.kv_bytes_per_token
    n = prefill_tokens
    attn = 4 * shape.layers * shape.q_dim * (batch * context + n * (n + 1) / 2)
    return nbytes, 2 * shape.params * (batch + n) + attn


def prefill_ms_per_token(shape: ModelShape, gpu: GpuPreset, prompt_tokens: int,
                         tp: int = 1) -> float:
    """The profile's linear prefill slope: the compute time of a ``prompt_tokens`` prompt
    (``step_seconds``'s FLOPs with b = 0) per token, at the FLOP roofline. The twin adds
    it to the decode step, which already holds the weight read and the overhead."""
    flops = _bytes_and_flops(shape, 0, 0, prompt_tokens)[1]
    return 1000 * flops / tp / (gpu.bf16_flops * gpu.flops_efficiency) / prompt_tokens


def kv_capacity_tokens(shape: ModelShape, gpu: GpuPreset, tp: int = 1) -> int:
    """KV tokens that fit: (GPU_MEMORY_UTILIZATION x memory x tp - weights) / KV bytes per
    token (activations and CUDA graphs left out)."""
    free = GPU_MEMORY_UTILIZATION * gpu.memory_bytes * tp - shape.params * shape.dtype_bytes
    if free <= 0:
        raise ValueError(f"the weights do not fit in {tp} x {gpu.name}")
    return int(free // shape.kv_bytes_per_token)


def modelled_cells(shape: ModelShape, gpu: GpuPreset, tp: int, batch_sizes: list[int],
                   contexts: list[int], decode_tokens: int) -> list[Cell]:
    """Decode cells as ``kernels_bench profile`` writes them; a cell at context c holds the
    step time at c + decode_tokens / 2, the context ``StepTimeModel`` places it at. No
    spread (p10 = p90 = median) and no samples."""
    out = []
    for c in contexts:
        for b in batch_sizes:
            ms = 1000 * step_seconds(shape, gpu, b, c + decode_tokens / 2, tp=tp)
            out.append(Cell(batch_size=b, context_tokens=c, step_ms=ms, step_ms_p10=ms,
                            step_ms_p90=ms, samples=0))
    return out


def modelled_profile(model: str, preset: str, tp: int = 1,
                     batch_sizes: tuple[int, ...] = BATCH_SIZES,
                     contexts: tuple[int, ...] = CONTEXTS, decode_tokens: int = 0,
                     prefill_tokens: int = 1024, dtype: str = "bfloat16",
                     base_dir: Path = Path()) -> EngineProfile:
    """The profile the twin reads, modelled (``modelled_file`` for the whole file)."""
    return decode_profile(modelled_file(model, preset, "model", tp, batch_sizes, contexts,
                                        decode_tokens, prefill_tokens, dtype, base_dir))


def modelled_file(model: str, preset: str, entry: str, tp: int = 1,
                  batch_sizes: tuple[int, ...] = BATCH_SIZES,
                  contexts: tuple[int, ...] = CONTEXTS, decode_tokens: int = 0,
                  prefill_tokens: int = 1024, dtype: str = "bfloat16",
                  base_dir: Path = Path(), reference_context: int = 512,
                  max_num_seqs: int | None = None) -> dict[str, Any]:
    """``<entry>.json`` (``profile_file``) modelled: the cells and the prefill slope of
    the roofline, ``machine`` the preset, ``modelled`` ``"roofline <preset>"``."""
    gpu = gpu_preset(preset)
    if tp < 1:
        raise ValueError(f"tp {tp}: at least 1")
    shape = model_shape(model_config(model, base_dir), dtype)
    cells = modelled_cells(shape, gpu, tp, sorted(batch_sizes), sorted(contexts),
                           decode_tokens)
    return profile_file(
        f"roofline {preset}" + (f" tp={tp}" if tp > 1 else ""), entry, model, cells,
        prefill_ms_per_token(shape, gpu, prefill_tokens, tp), kv_capacity_tokens(shape, gpu, tp),
        max_num_seqs or max(batch_sizes), reference_context, decode_tokens,
        {**asdict(gpu), "tp": tp, "dtype": dtype, "params": shape.params})


def gpu_preset(name: str) -> GpuPreset:
    """A preset by name; a clear error naming the known ones."""
    if name not in GPU_PRESETS:
        raise ValueError(f"GPU preset {name!r}: known presets are {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[name]


def profile_file(modelled: str, entry: str, model: str, cells: list[Cell],
                 prefill_ms_per_token: float, kv_tokens: int, max_num_seqs: int,
                 reference_context: int, decode_tokens: int,
                 machine: dict[str, Any]) -> dict[str, Any]:
    """``<entry>.json`` with the fields ``kernels_bench profile`` writes
    (``predictors.profile.summarize``) for step times it did not measure: ``samples`` 0, no
    prefill curve, ``prefill_fixed_ms`` 0, and ``modelled`` saying where they come from."""
    ms, max_batch, ctx = profile_numbers(cells, max_num_seqs, kv_tokens, reference_context,
                                         decode_tokens)
    return {
        "modelled": modelled,
        "engine": f"{entry}-0", "entry": entry, "model": model, "served_model_name": entry,
        "decode_ms_per_token": ms, "max_batch_size": max_batch, "reference_context": ctx,
        "decode_tokens": decode_tokens, "prefill_ms_per_token": prefill_ms_per_token,
        "prefill_fixed_ms": 0.0, "kv_capacity_tokens": kv_tokens, "max_num_seqs": max_num_seqs,
        "decode_curve": [{**asdict(c), "tokens_per_s": c.tokens_per_s} for c in cells],
        "skipped": [], "prefill_curve": [], "machine": machine,
    }


def decode_profile(file: dict[str, Any]) -> EngineProfile:
    """A profile file's dict as the twin reads it (msgspec's error names a bad field)."""
    return msgspec.json.decode(json.dumps(file).encode(), type=EngineProfile)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.roofline",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="builtin:NAME or a folder with config.json")
    p.add_argument("--gpu", required=True, help=f"one of {', '.join(GPU_PRESETS)}")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
    p.add_argument("--entry", required=True, help="the cluster file's engine entry")
    p.add_argument("--out", type=Path, required=True, help="the profile file to write")
    p.add_argument("--max-num-seqs", type=int, default=None)
    a = p.parse_args(argv)
    try:
        file = modelled_file(a.model, a.gpu, a.entry, a.tp, max_num_seqs=a.max_num_seqs)
    except ValueError as e:
        p.error(str(e))
    decode_profile(file)
    a.out.write_text(json.dumps(file, indent=2) + "\n")
    print(f"wrote {a.out}: {file['modelled']}, {a.model}, "
          f"{file['machine']['params'] / 1e9:.2f}B params; decode at batch 1, context "
          f"{CONTEXTS[0]}: {file['decode_curve'][0]['step_ms']:.2f} ms/step", file=sys.stderr)


if __name__ == "__main__":
    main()
