"""``python -m kernels_bench kernels``: a model shape's decode step and prefill, timed in plain
torch on the device present (CUDA if torch sees one, else the CPU), into a measured-floor file.

For each ``--model`` (its shape from ``config.json``: ``kernels_bench.lib.model_config``; random
weights, ``floor.decoder``):

- decode, every batch b x context c: one step of b sequences at c cached tokens, eager
  (``eager_ms``) and on CUDA as a replayed CUDA graph (``graph_ms``, vLLM's way; null on a
  CPU); its parts alone: the GEMMs (``gemm_ms``) and the attention over the cache
  (``attention_ms``), timed as graphs on CUDA, eagerly on a CPU;
- prefill, every prompt length T: one prompt of T tokens from position 0 (``ms`` eager,
  ``ms_per_token`` = ms / T, ``graph_ms``, ``gemm_ms``, ``attention_ms`` as above).

The file: ``{"device", "torch", "dtype", "repeats", "decode": [{model, batch, context,
eager_ms, graph_ms, gemm_ms, attention_ms}], "prefill": [{model, prompt_tokens, ms,
ms_per_token, graph_ms, gemm_ms, attention_ms}]}``, times in ms (means over ``--repeats``
calls after 3 untimed ones); ``model`` is the shape's name (``model_config.shape_name``).
The format of docs/research/twin/floors/h200-2026-11-26.json, which adds the roofline per cell;
``python -m kernels_bench.lab.twin.floor`` turns it into twin profiles and a table against the
roofline. Not measured: vLLM's own per-step work (scheduling, input preparation, sampling),
paged attention kernels, tensor parallelism.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernels_bench.floor.decoder import Decoder, DecoderShape
from kernels_bench.floor.timing import eager_ms, graph_ms
from kernels_bench.lib.model_config import model_config, shape_name

BATCHES = (1, 8, 32, 64, 128)
CONTEXTS = (512, 2048)
PROMPTS = (512, 2048)
REPEATS = 30
QUICK = {"batches": (1, 4), "contexts": (64,), "prompts": (16, 32), "repeats": 3}
"""``--quick``: a grid that runs in seconds on a CPU (for tests and a first look)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def measure(models: list[str], batches: list[int], contexts: list[int], prompts: list[int],
            dtype: torch.dtype, repeats: int, device: torch.device,
            base_dir: Path = Path()) -> dict[str, Any]:
    """The floor file's contents (module docstring), with a progress line per cell on
    stderr."""
    shapes = {shape_name(m): DecoderShape.from_config(model_config(m, base_dir)) for m in models}
    if len(shapes) != len(models):
        raise ValueError(f"models {models}: two of them have the same shape name")
    cuda = device.type == "cuda"
    total = len(shapes) * (len(batches) * len(contexts) + len(prompts))
    decode: list[dict[str, Any]] = []
    prefill: list[dict[str, Any]] = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, shape in shapes.items():
            dec = Decoder(shape, max(batches), max(max(contexts) + 1, max(prompts)), device,
                          dtype)
            say(f"{name}: {_gb(dec)} on {device} ({dtype})")
            for c in contexts:
                for b in batches:
                    cell = _cell(dec, b, 1, c, dtype, repeats, cuda)
                    decode.append({"model": name, "batch": b, "context": c, **cell})
                    say(f"[{len(decode) + len(prefill)}/{total}] {name} decode b={b} c={c}: "
                         + _times(cell))
            for t in prompts:
                cell = _cell(dec, 1, t, 0, dtype, repeats, cuda)
                prefill.append({"model": name, "prompt_tokens": t, "ms": cell["eager_ms"],
                                "ms_per_token": cell["eager_ms"] / t,
                                **{k: v for k, v in cell.items() if k != "eager_ms"}})
                say(f"[{len(decode) + len(prefill)}/{total}] {name} prefill T={t}: "
                     + _times(cell))
            del dec
            if cuda:
                torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."),
            "repeats": repeats, "decode": decode, "prefill": prefill}


def _cell(dec: Decoder, batch: int, tokens: int, pos: int, dtype: torch.dtype, repeats: int,
          cuda: bool) -> dict[str, float | None]:
    """One step of ``batch`` sequences with ``tokens`` new tokens each at cache position
    ``pos`` (decode: 1 token at c; prefill: T tokens at 0), and its parts."""
    s, dev = dec.shape, dec.k.device
    rows = batch * tokens

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=dev, dtype=dtype)

    x = rand(batch, tokens, s.hidden)
    gemm_in = (rand(rows, s.hidden), rand(rows, s.heads * s.head_dim),
               rand(rows, s.intermediate), rand(batch, s.hidden))
    q = rand(batch, s.heads, tokens, s.head_dim)
    parts: dict[str, Callable[[], object]] = {
        "gemm_ms": lambda: dec.gemms(*gemm_in),
        "attention_ms": lambda: dec.attention(q, pos + tokens),
    }

    def step() -> torch.Tensor:
        return dec.step(x, pos)

    def timed(fn: Callable[[], object]) -> float:
        return graph_ms(fn, repeats) if cuda else eager_ms(fn, repeats, cuda)

    return {"eager_ms": eager_ms(step, repeats, cuda),
            "graph_ms": graph_ms(step, repeats) if cuda else None,
            **{k: timed(fn) for k, fn in parts.items()}}


def _times(cell: dict[str, float | None]) -> str:
    return ", ".join(f"{k.removesuffix('_ms')} {v:.3f} ms" for k, v in cell.items()
                     if v is not None)


def _gb(dec: Decoder) -> str:
    weights = sum(t.numel() * t.element_size() for group in
                  (dec.qkv, dec.o, dec.gate_up, dec.down, [dec.lm_head]) for t in group)
    cache = 2 * dec.k.numel() * dec.k.element_size()
    return f"weights {weights / 1e9:.2f} GB, KV cache {cache / 1e9:.2f} GB"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
