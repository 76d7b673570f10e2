"""``python -m kernels_bench kernels``: its options and the floor file it writes (the
measurement: ``floor.measure``). Torch and the standard library only, as ``floor``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kernels_bench.floor import measure as floor_measure
from kernels_bench.floor.measure import (BATCHES, CONTEXTS, DTYPES, PROMPTS, QUICK, REPEATS,
                                         measure, say)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench kernels",
                                description=floor_measure.__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", required=True, metavar="SPEC",
                   help="builtin:NAME or a folder with config.json (several: one file)")
    p.add_argument("--batches", nargs="+", type=_positive, metavar="B",
                   help=f"decode batch sizes (default {' '.join(map(str, BATCHES))})")
    p.add_argument("--contexts", nargs="+", type=_positive, metavar="C",
                   help=f"decode contexts, tokens (default {' '.join(map(str, CONTEXTS))})")
    p.add_argument("--prompts", nargs="+", type=_positive, metavar="T",
                   help=f"prefill prompt lengths (default {' '.join(map(str, PROMPTS))})")
    p.add_argument("--repeats", type=_positive, help=f"timed calls per cell (default {REPEATS})")
    p.add_argument("--dtype", choices=DTYPES,
                   help="default bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--quick", action="store_true",
                   help="a small grid (batches 1 4, context 64, prompts 16 32, 3 repeats) "
                   "that runs in seconds on a CPU; explicit options win")
    p.add_argument("--out", type=Path, required=True, help="the floor file (JSON) to write")
    a = p.parse_args(argv)
    defaults = QUICK if a.quick else {"batches": BATCHES, "contexts": CONTEXTS,
                                      "prompts": PROMPTS, "repeats": REPEATS}
    grid = {k: getattr(a, k) or v for k, v in defaults.items()}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[a.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    try:
        floor = measure(a.model, sorted(set(grid["batches"])), sorted(set(grid["contexts"])),
                        sorted(set(grid["prompts"])), dtype, grid["repeats"], device)
    except ValueError as e:
        p.error(str(e))
    except torch.OutOfMemoryError:
        sys.exit(f"out of {device} memory: measure fewer or smaller --batches, --contexts "
                 "or --prompts")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(floor, indent=1) + "\n")
    say(f"wrote {a.out}: {len(floor['decode'])} decode and {len(floor['prefill'])} prefill "
         f"cells on {floor['device']}")
