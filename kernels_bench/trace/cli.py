"""``python -m kernels_bench trace <command>``: build, convert, check, judge and describe
traces."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from router.config.cluster import ConfigError
from router.trace_format import TraceFormatError

COMMANDS = {
    "build": ("kernels_bench.trace.build", "run a cluster's models over a suite's workflows"),
    "champ": ("kernels_bench.trace.champ", "convert champ-dataset into a trace"),
    "datasheet": ("kernels_bench.trace.datasheet", "write the datasheet of trace files"),
    "rejudge": ("kernels_bench.trace.rejudge", "judge a finished trace again from its outputs"),
}


def validate(argv: list[str]) -> None:
    """``trace validate FILE...``: load each file, print its counts or the first error."""
    from router.trace_format import load_trace

    ap = argparse.ArgumentParser(prog="python -m kernels_bench trace validate")
    ap.add_argument("files", nargs="+", type=Path)
    failed = False
    for f in ap.parse_args(argv).files:
        try:
            t = load_trace(f)
        except (TraceFormatError, OSError) as e:
            print(f"INVALID {e}")
            failed = True
            continue
        units = sum(len(r.models) for r in t.runs)
        print(f"ok {f}: suite {t.header.suite}, {len(t.runs)} workflow runs, {units} units, "
              f"models {', '.join(t.models)}")
    if failed:
        sys.exit(1)


def compact(argv: list[str]) -> None:
    """``trace compact SRC DST``: one gzip member, units sorted by key."""
    from router.trace_format import compact as do_compact

    ap = argparse.ArgumentParser(prog="python -m kernels_bench trace compact")
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    args = ap.parse_args(argv)
    print(f"{do_compact(args.src, args.dst)} units -> {args.dst}")


def main(argv: list[str]) -> None:
    local = {"validate": (validate, "check trace files"),
             "compact": (compact, "recompress a trace (one gzip member, sorted)")}
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m kernels_bench trace <command> [options]\n\ncommands:")
        for name, (_, desc) in {**COMMANDS, **local}.items():
            print(f"  {name:10} {desc}")
        return
    if argv[0] in local:
        run = local[argv[0]][0]
    elif argv[0] in COMMANDS:
        run = importlib.import_module(COMMANDS[argv[0]][0]).main
    else:
        sys.exit(f"unknown trace command {argv[0]!r}; see --help")
    try:
        run(argv[1:])
    except (TraceFormatError, ConfigError, OSError) as e:
        sys.exit(f"trace {argv[0]}: error: {e}")
