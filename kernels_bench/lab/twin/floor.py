"""Twin profiles from a measured floor: a GPU's measured step times plus a stated engine
overhead, so a GPU profiled once with ``python -m kernels_bench kernels`` runs in the twin.

A floor file (``kernels_bench.floor.measure``; docs/research/twin/floors/) holds, per model shape,
decode step times by batch and context and prefill times by prompt length, measured in
plain torch: the GPU work of a step without vLLM's own per-step work. ``floor_file``
writes the ``<entry>.json`` that ``kernels_bench profile`` measures and
``kernels_bench.lab.twin.roofline`` models (``roofline.profile_file``)::

    decode cell (b, c)    = F(b, c) + overhead
    prefill_ms_per_token  = F_prefill(T_max) / T_max

- F(b, c): the floor's decode time at batch b and context c, its CUDA-graph replay
  (``graph_ms``, what vLLM runs) where the file has one, else eager (``eager_ms``); the
  cells are the floor's own grid, placed at context c (``decode_tokens`` 0), and
  ``StepTimeModel`` interpolates them, linear in batch then in context, the end segments
  extended;
- overhead: vLLM's per-step work (scheduling, input preparation, sampling), a stated
  parameter in ms: not measured;
- prefill: the floor's time of its longest prompt T_max (graph where measured, else eager)
  per token. It holds a whole forward pass (weights, launches), so it is exact for a lone
  prompt of T_max tokens and an upper bound per token beside a decode batch, whose cell
  already holds the weight read; the slope between two prompt lengths is not used: eager
  prefill of small shapes is launch-bound (0.5B on the H200: 5.4 ms at 512 tokens, 5.5 at
  2,048), so its slope is not the compute cost;
- ``kv_capacity_tokens``: ``roofline.kv_capacity_tokens`` of the ``--gpu`` preset;
- with ``--prefill-attention``, prefill's attention term (``StepTimeModel.step_ms``'s A,
  ``prefill_attention_ms_per_pair``) from the roofline anchored at the measured longest
  prompt, and P what is left of that prompt's time (``prefill_attention``): the same
  time for a lone prompt of T_max tokens, attention growing with context beyond it
  (modelled, not measured, past T_max).

``floor_table`` sets the floor beside ``roofline.floor_seconds`` (the roofline without its
overhead) per shape, batch and context, and per prompt length.

CLI: ``python -m kernels_bench.lab.twin.floor profile --floor FILE --gpu PRESET --model SPEC
--entry NAME --overhead-ms X --out FILE`` and ``... table --floor FILE --gpu PRESET
[--model SHAPE=SPEC ...] [--plot FILE]``. docs/research/twin.md, "A measured floor".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from engine_ext.builtin_models import BUILTIN_MODELS, PREFIX
from kernels_bench.lab.twin.roofline import (GpuPreset, ModelShape, decode_profile, floor_seconds,
                                             gpu_preset, kv_capacity_tokens, model_shape,
                                             profile_file)
from kernels_bench.lab.twin.step_time import Ms
from kernels_bench.lib.model_config import SHAPE_SUFFIX, model_config, shape_name
from kernels_bench.predictors.profile import Cell

REFERENCE_CONTEXT = 512
"""The context ``decode_ms_per_token`` is read at (``predictors.profile.profile_numbers``)."""


class DecodeCell(msgspec.Struct, frozen=True):
    """One decode step of a floor file (other fields, such as ``gemm_ms``, are not read)."""

    model: str
    """The shape's name (``model_config.shape_name``)."""
    batch: Annotated[int, msgspec.Meta(ge=1)]
    context: Annotated[int, msgspec.Meta(ge=0)]
    eager_ms: Ms
    graph_ms: Ms | None = None
    """The step replayed as a CUDA graph; null where none was captured (a CPU)."""
    roofline_ms: float | None = None
    """The roofline the measuring script computed beside the cell, if any (checked against
    ``roofline.floor_seconds`` by the table)."""

    @property
    def floor_ms(self) -> float:
        return self.eager_ms if self.graph_ms is None else self.graph_ms


class PrefillCell(msgspec.Struct, frozen=True):
    """One prompt's prefill of a floor file."""

    model: str
    prompt_tokens: Annotated[int, msgspec.Meta(ge=1)]
    ms: Ms
    """Eager."""
    graph_ms: Ms | None = None

    @property
    def floor_ms(self) -> float:
        return self.ms if self.graph_ms is None else self.graph_ms


class Floor(msgspec.Struct, frozen=True):
    """A measured-floor file (``kernels_bench.floor.measure``'s docstring has every field)."""

    device: str
    torch: str
    decode: list[DecodeCell]
    prefill: list[PrefillCell]


def load_floor(path: Path) -> Floor:
    """A floor file, validated: a ValueError naming the file and what is wrong (an
    unreadable file, a bad field, a cell measured twice)."""
    try:
        floor = msgspec.json.decode(path.read_bytes(), type=Floor)
    except (OSError, msgspec.DecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"floor file {path}: {e}") from None
    for kind, keys in (("decode", [(c.model, c.batch, c.context) for c in floor.decode]),
                       ("prefill", [(c.model, c.prompt_tokens) for c in floor.prefill])):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"floor file {path}: {kind} cell {twice[0]} measured twice")
    return floor


def decode_cells(floor: Floor, shape: str, overhead_ms: float) -> list[Cell]:
    """The profile's decode cells: F(b, c) + overhead on the floor's grid (no spread)."""
    rows = [c for c in floor.decode if c.model == shape]
    if not rows:
        raise ValueError(f"the floor has no decode cells of shape {shape!r} "
                         f"(it has: {', '.join(_shapes(floor))})")
    return [Cell(batch_size=c.batch, context_tokens=c.context, step_ms=c.floor_ms + overhead_ms,
                 step_ms_p10=c.floor_ms + overhead_ms, step_ms_p90=c.floor_ms + overhead_ms,
                 samples=0) for c in sorted(rows, key=lambda c: (c.context, c.batch))]


def prefill_ms_per_token(floor: Floor, shape: str) -> float:
    """The longest prompt's prefill time per token (module docstring)."""
    rows = [c for c in floor.prefill if c.model == shape]
    if not rows:
        raise ValueError(f"the floor has no prefill cells of shape {shape!r}")
    longest = max(rows, key=lambda c: c.prompt_tokens)
    return longest.floor_ms / longest.prompt_tokens


def prefill_attention(floor: Floor, shape: str, mshape: ModelShape, gpu: GpuPreset
                      ) -> tuple[float, float, int]:
    """(P, A, T_max): prefill's per-token and attention terms of ``StepTimeModel.step_ms``
    fitted to the floor's longest prompt of ``shape``, T_max tokens measured F ms::

        A = 4 x layers x q_dim / (peak x eff_flops) x F / R     (ms per query-key pair)
        P = (F - A x T_max^2 / 2) / T_max

    4 x layers x q_dim FLOPs per (query, key) pair is the roofline's attention
    (``roofline.step_seconds``), R its time for the T_max prompt (``floor_seconds``):
    the roofline's attention scaled by what the measured prompt took of the roofline's
    time, so P T_max + A T_max^2 / 2 = F exactly. Measured at T_max only; the growth
    beyond it is the roofline's, modelled."""
    rows = [c for c in floor.prefill if c.model == shape]
    if not rows:
        raise ValueError(f"the floor has no prefill cells of shape {shape!r}")
    longest = max(rows, key=lambda c: c.prompt_tokens)
    t, measured = longest.prompt_tokens, longest.floor_ms
    roof = 1000 * floor_seconds(mshape, gpu, 0, 0, prefill_tokens=t)
    pair = 4 * mshape.layers * mshape.q_dim / (gpu.bf16_flops * gpu.flops_efficiency) * 1000
    a = pair * measured / roof
    p = (measured - a * t * t / 2) / t
    if p < 0:
        raise ValueError(f"shape {shape!r}: the roofline's attention exceeds the measured "
                         f"{t}-token prefill")
    return p, a, t


def floor_file(floor_path: Path, model: str, preset: str, entry: str, overhead_ms: float,
               shape: str | None = None, dtype: str = "bfloat16",
               max_num_seqs: int | None = None, base_dir: Path = Path(),
               attention: bool = False) -> dict[str, Any]:
    """``<entry>.json`` from a floor (module docstring); ``shape`` defaults to ``model``'s
    shape name, ``max_num_seqs`` to the floor's largest batch; ``attention``: prefill's
    attention term fitted (``prefill_attention``), else prefill linear."""
    if not 0 <= overhead_ms <= 1e6:
        raise ValueError(f"overhead {overhead_ms} ms: must be in [0, 1e6]")
    gpu = gpu_preset(preset)
    floor = load_floor(floor_path)
    name = shape or shape_name(model)
    try:
        cells = decode_cells(floor, name, overhead_ms)
        prefill = prefill_ms_per_token(floor, name)
    except ValueError as e:
        raise ValueError(f"floor file {floor_path}: {e}") from None
    mshape = model_shape(model_config(model, base_dir), dtype)
    modelled = f"measured floor {floor_path.name} ({floor.device}) + overhead {overhead_ms:g} ms"
    pair = 0.0
    if attention:
        prefill, pair, t = prefill_attention(floor, name, mshape, gpu)
        modelled += (f"; prefill attention from the {preset} roofline anchored at the "
                     f"measured {t}-token prefill (modelled beyond {t} tokens)")
    file = profile_file(
        modelled, entry, model, cells, prefill, kv_capacity_tokens(mshape, gpu),
        max_num_seqs or max(c.batch_size for c in cells), REFERENCE_CONTEXT, 0,
        {"floor": floor_path.name, "device": floor.device, "torch": floor.torch,
         "shape": name, "overhead_ms": overhead_ms, "kv_sized_by": preset,
         "memory_bytes": gpu.memory_bytes, "dtype": dtype, "params": mshape.params})
    if attention:
        file["prefill_attention_ms_per_pair"] = pair
    return file


def floor_table(floor: Floor, gpu: GpuPreset, models: Mapping[str, str] | None = None,
                base_dir: Path = Path()) -> str:
    """Markdown: measured decode (F) against ``roofline.floor_seconds`` per shape, context
    and batch, then prefill per prompt length; shapes without a config are named below
    (``models``: shape name -> model spec, for shapes with no built-in shape twin)."""
    shapes, missing = _model_shapes(floor, models or {}, base_dir)
    batches = sorted({c.batch for c in floor.decode})
    out = [f"Decode step on {floor.device}, ms: measured (a CUDA-graph replay where the file "
           f"has one, else eager) / roofline {gpu.name} without overhead "
           "(measured over roofline):", "",
           "| shape | context | " + " | ".join(f"b = {b}" for b in batches) + " |",
           "|---|---|" + "---|" * len(batches)]
    for name, ms in shapes.items():
        for ctx in sorted({c.context for c in floor.decode if c.model == name}):
            at = {c.batch: c.floor_ms for c in floor.decode if (c.model, c.context) == (name, ctx)}
            out.append(f"| {name} | {ctx} | " + " | ".join(
                _pair(at[b], 1000 * floor_seconds(ms, gpu, b, ctx)) if b in at else "-"
                for b in batches) + " |")
    out += ["", "Prefill of one prompt, ms (measured: graph where the file has one, else "
            "eager):", "",
            "| shape | prompt tokens | measured | roofline | measured / roofline | "
            "measured per token |", "|---|---|---|---|---|---|"]
    for name, ms in shapes.items():
        for c in sorted((c for c in floor.prefill if c.model == name),
                        key=lambda c: c.prompt_tokens):
            roof = 1000 * floor_seconds(ms, gpu, 0, 0, prefill_tokens=c.prompt_tokens)
            out.append(f"| {name} | {c.prompt_tokens} | {c.floor_ms:.2f} | {roof:.2f} | "
                       f"{c.floor_ms / roof:.1f}x | {c.floor_ms / c.prompt_tokens:.5f} |")
    checked = [abs(1000 * floor_seconds(shapes[c.model], gpu, c.batch, c.context)
                   / c.roofline_ms - 1) for c in floor.decode
               if c.model in shapes and c.roofline_ms]
    out.append("")
    if checked:
        out.append(f"The file's own `roofline_ms` differs from `roofline.floor_seconds` by at "
                   f"most {100 * max(checked):.1f}% over its {len(checked)} decode cells.")
    if missing:
        out.append(f"Not tabulated (no config.json; give --model SHAPE=SPEC): "
                   f"{', '.join(missing)}.")
    return "\n".join(out).rstrip() + "\n"


def _pair(measured: float, roofline: float) -> str:
    return f"{measured:.2f} / {roofline:.2f} ({measured / roofline:.1f}x)"


def _shapes(floor: Floor) -> list[str]:
    return list(dict.fromkeys(c.model for c in [*floor.decode, *floor.prefill]))


def _model_shapes(floor: Floor, models: Mapping[str, str],
                  base_dir: Path) -> tuple[dict[str, ModelShape], list[str]]:
    """The floor's shapes with a config (``models``, else ``builtin:<shape>-shape``) and
    the names of those without one."""
    found, missing = {}, []
    for name in _shapes(floor):
        spec = models.get(name)
        if spec is None and name + SHAPE_SUFFIX in BUILTIN_MODELS:
            spec = PREFIX + name + SHAPE_SUFFIX
        if spec is None:
            missing.append(name)
        else:
            found[name] = model_shape(model_config(spec, base_dir))
    unknown = sorted(set(models) - set(found))
    if unknown:
        raise ValueError(f"--model {unknown[0]}=...: the floor has no shape {unknown[0]!r}")
    return found, missing


def _plot(floor: Floor, gpu: GpuPreset, shapes: Mapping[str, ModelShape], path: Path) -> None:
    """Decode step time against batch, measured (solid) and roofline (dashed), one panel
    per context, a colour per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({c.context for c in floor.decode})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4), squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        for i, (name, ms) in enumerate(shapes.items()):
            cells = sorted((c for c in floor.decode if (c.model, c.context) == (name, ctx)),
                           key=lambda c: c.batch)
            b = [c.batch for c in cells]
            ax.plot(b, [c.floor_ms for c in cells], "o-", color=f"C{i}", label=name)
            ax.plot(b, [1000 * floor_seconds(ms, gpu, x, ctx) for x in b], "--",
                    color=f"C{i}")
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="decode step, ms",
               title=f"{floor.device}, context {ctx} (dashed: roofline {gpu.name})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.floor",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="write a twin profile (<entry>.json) from a floor")
    prof.add_argument("--floor", type=Path, required=True, help="the measured-floor file")
    prof.add_argument("--gpu", required=True,
                      help="the GPU preset whose memory sizes the KV cache (roofline.py)")
    prof.add_argument("--model", required=True, help="builtin:NAME or a folder with config.json")
    prof.add_argument("--shape", help="the floor's shape name (default: the model's, e.g. "
                      "qwen2.5-1.5b for builtin:qwen2.5-1.5b-shape)")
    prof.add_argument("--entry", required=True, help="the cluster file's engine entry")
    prof.add_argument("--overhead-ms", type=float, required=True,
                      help="vLLM's per-step work on top of the floor (a stated parameter)")
    prof.add_argument("--max-num-seqs", type=int, help="default: the floor's largest batch")
    prof.add_argument("--prefill-attention", action="store_true",
                      help="fit prefill's attention term (roofline anchored at the longest "
                      "measured prompt; modelled beyond it); default: prefill linear")
    prof.add_argument("--out", type=Path, required=True, help="the profile file to write")
    table = sub.add_parser("table", help="print the floor against the roofline (markdown)")
    table.add_argument("--floor", type=Path, required=True, help="the measured-floor file")
    table.add_argument("--gpu", required=True, help="the GPU preset of the roofline")
    table.add_argument("--model", nargs="+", default=[], metavar="SHAPE=SPEC",
                       help="a config for a shape with no built-in shape twin")
    table.add_argument("--plot", type=Path, help="also write this PNG")
    a = p.parse_args(argv)
    try:
        if a.command == "profile":
            file = floor_file(a.floor, a.model, a.gpu, a.entry, a.overhead_ms, a.shape,
                              max_num_seqs=a.max_num_seqs, attention=a.prefill_attention)
            decode_profile(file)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(file, indent=2) + "\n")
            print(f"wrote {a.out}: {file['modelled']}; decode at batch 1, context "
                  f"{file['decode_curve'][0]['context_tokens']}: "
                  f"{file['decode_curve'][0]['step_ms']:.2f} ms/step", file=sys.stderr)
            return
        models = dict(_key_value(m) for m in a.model)
        floor, gpu = load_floor(a.floor), gpu_preset(a.gpu)
        print(floor_table(floor, gpu, models), end="")
        if a.plot:
            _plot(floor, gpu, _model_shapes(floor, models, Path())[0], a.plot)
            print(f"wrote {a.plot}", file=sys.stderr)
    except ValueError as e:
        p.error(str(e))


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not (sep and key and value):
        raise ValueError(f"--model {text!r}: expected SHAPE=SPEC")
    return key, value


if __name__ == "__main__":
    main()
