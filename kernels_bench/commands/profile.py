"""``python -m kernels_bench profile --cluster FILE``: its options (the profile:
``predictors.profile``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernels_bench.predictors import profile
from kernels_bench.predictors.profile import ERRORS, ProfileOptions, run_profile


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench profile",
                                description=profile.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", type=Path, required=True)
    p.add_argument("--engines", nargs="+", default=[], metavar="NAME",
                   help="engine entries to profile (default: every local one)")
    p.add_argument("--batch-sizes", nargs="+", type=int, metavar="B",
                   help="default: 1, 2, 4, ... up to each engine's max_num_seqs")
    p.add_argument("--contexts", nargs="+", type=int, default=[128, 512, 2048],
                   help="prompt lengths (capped by max_model_len; default 128 512 2048)")
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--reference-context", type=int, default=512)
    p.add_argument("--trace", type=Path, help="fills mean_output_tokens from this trace")
    p.add_argument("--model-map", action="append", default=[], metavar="SERVED=TRACE,...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_results/profile"))
    p.add_argument("--run-dir", type=Path, help="engine logs and sockets (default <out>/cluster)")
    a = p.parse_args(argv)
    if a.decode_tokens < 8 or a.reference_context < 1 or any(b < 1 for b in a.batch_sizes or []):
        p.error("--decode-tokens must be >= 8, batch sizes and --reference-context >= 1")
    options = ProfileOptions(a.out, a.run_dir, a.batch_sizes, a.contexts, a.decode_tokens,
                             a.reference_context, a.seed)
    try:  # of every engine: `kernels_bench artifacts --profile` takes it as done
        run_profile(a.cluster, a.engines, options, a.trace, a.model_map)
    except ERRORS as e:
        sys.exit(f"error: {e}")
