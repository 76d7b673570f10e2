"""``python -m kernels_bench results``: docs/research/results.md from a replay (the page:
``replay.results``)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from kernels_bench.lab.replay import results
from kernels_bench.lab.replay.output import RESULTS_ROOT, load_summary, plots_of, read_jsonl
from kernels_bench.lab.replay.results import (NOTES, excluded_section, latest_run, problem_list,
                                              render)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench results",
                                description=results.__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, help=f"replay output folder (default: the latest "
                   f"under {RESULTS_ROOT})")
    p.add_argument("--out", type=Path, default=Path("docs/research/results.md"))
    p.add_argument("--exclude-problems", type=Path, metavar="FILE",
                   help="also give the intervals without these problems (a JSON list of "
                   "problem ids), e.g. those a setting was tuned on")
    a = p.parse_args(argv)
    try:
        run = a.run or latest_run(RESULTS_ROOT)
        summary = load_summary(run)
        excluded = ""
        if a.exclude_problems:
            excluded = excluded_section(summary, read_jsonl(run / "workflows.jsonl"),
                                        problem_list(a.exclude_problems),
                                        a.exclude_problems.name)
    except ValueError as e:
        sys.exit(f"error: {e}")
    images = a.out.parent / a.out.stem
    images.mkdir(parents=True, exist_ok=True)
    for name in plots_of(summary):
        if (run / name).exists():
            shutil.copyfile(run / name, images / name)
    notes = (run / NOTES).read_text(encoding="utf-8") if (run / NOTES).exists() else None
    a.out.write_text(render(summary, run.name, images.name, notes, excluded),
                     encoding="utf-8")
    print(f"wrote {a.out} and {images}/ from {run}")
