"""A floor for a shape no GPU measured: the roofline fitted to the shapes a GPU did measure
(issue 61: a 14B-shaped engine beside the measured 1.5B and 7B shapes of the H200 floor).

``fitted_floor`` fits, by least squares over every decode cell of the measured shapes::

    F(b, c) = a + k x R(b, c)        R: roofline.floor_seconds (the roofline, no overhead)

and the same over their prefill cells (``F_p(n) = a_p + k_p x R(0, 0, n)``), then writes a
floor file (the format of ``kernels_bench.floor.measure``, read by
``kernels_bench.lab.twin.floor profile``) holding the target shape's cells on the measured
grid, each ``a + k x R`` of the target's shape. The result is **modelled, not measured**: its
``device`` says "fitted", its ``torch`` field holds the fit (a, k, the shapes it came from
and the fit's largest relative error on them). The measured cells are copied beside it, so
one file serves every shape of a scenario.

CLI::

    python -m kernels_bench.lab.twin.fit_floor --floor FILE --gpu h200 \
        --measured qwen2.5-1.5b=builtin:qwen2.5-1.5b-shape \
        --measured qwen2.5-7b=docs/research/twin/floors/qwen2.5-7b \
        --target qwen2.5-14b=docs/research/twin/floors/qwen2.5-14b --out FILE

docs/research/overload.md, "A 14B-shaped floor".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from kernels_bench.lab.twin.floor import DecodeCell, Floor, PrefillCell, load_floor
from kernels_bench.lab.twin.roofline import floor_seconds, gpu_preset, model_shape
from kernels_bench.lib.model_config import model_config


def _fit(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + k x; also the largest relative error of the fit on its points."""
    k, a = np.polyfit(np.asarray(x), np.asarray(y), 1)
    err = max(abs(a + k * xi - yi) / yi for xi, yi in zip(x, y))
    return float(a), float(k), float(err)


def fitted_floor(floor: Floor, preset: str, measured: Mapping[str, str], target: str,
                 target_model: str, base_dir: Path = Path()) -> dict[str, Any]:
    """The floor file's dict: ``floor``'s cells plus ``target``'s fitted ones (module
    docstring). ``measured`` maps a floor shape name to its model (``builtin:NAME`` or a
    folder with ``config.json``)."""
    gpu = gpu_preset(preset)
    shapes = {name: model_shape(model_config(spec, base_dir)) for name, spec in measured.items()}
    tshape = model_shape(model_config(target_model, base_dir))
    dec = [c for c in floor.decode if c.model in shapes]
    pre = [c for c in floor.prefill if c.model in shapes]
    missing = sorted(set(shapes) - {c.model for c in dec})
    if missing or not pre:
        raise ValueError(f"the floor has no decode or prefill cells of {missing or list(shapes)}")
    a, k, err = _fit([1000 * floor_seconds(shapes[c.model], gpu, c.batch, c.context) for c in dec],
                     [c.floor_ms for c in dec])
    ap, kp, errp = _fit([1000 * floor_seconds(shapes[c.model], gpu, 0, 0, c.prompt_tokens)
                         for c in pre], [c.floor_ms for c in pre])
    grid = sorted({(c.batch, c.context) for c in dec})
    prompts = sorted({c.prompt_tokens for c in pre})
    new_dec = [DecodeCell(model=target, batch=b, context=ctx, eager_ms=round(
        a + k * 1000 * floor_seconds(tshape, gpu, b, ctx), 4)) for b, ctx in grid]
    new_pre = [PrefillCell(model=target, prompt_tokens=n, ms=round(
        ap + kp * 1000 * floor_seconds(tshape, gpu, 0, 0, n), 4)) for n in prompts]
    out = Floor(device=f"{floor.device} (fitted: {target} = a + k x roofline {preset})",
                torch=(f"fitted on {', '.join(sorted(shapes))} of {floor.device}: decode a = "
                       f"{a:.3f} ms, k = {k:.3f} (max error {100 * err:.1f}%); prefill a = "
                       f"{ap:.3f} ms, k = {kp:.3f} (max error {100 * errp:.1f}%); measured "
                       f"cells: {floor.torch}"),
                decode=[c for c in floor.decode if c.model != target] + new_dec,
                prefill=[c for c in floor.prefill if c.model != target] + new_pre)
    return msgspec.to_builtins(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.fit_floor",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--floor", type=Path, required=True, help="the measured-floor file")
    p.add_argument("--gpu", required=True, help="the roofline's GPU preset (e.g. h200)")
    p.add_argument("--measured", nargs="+", required=True, metavar="SHAPE=SPEC",
                   help="floor shapes to fit on and their models")
    p.add_argument("--target", required=True, metavar="SHAPE=SPEC",
                   help="the shape to model and its model")
    p.add_argument("--out", type=Path, required=True, help="the floor file to write")
    args = p.parse_args(argv)
    try:
        measured = dict(kv.split("=", 1) for kv in args.measured)
        target, spec = args.target.split("=", 1)
        data = fitted_floor(load_floor(args.floor), args.gpu, measured, target, spec)
    except ValueError as e:
        sys.exit(f"error: {e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(msgspec.json.format(msgspec.json.encode(data), indent=1) + b"\n")
    print(f"{args.out}: {data['torch'].split('; measured cells')[0]}")


if __name__ == "__main__":
    main()
