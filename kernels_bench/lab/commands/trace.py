"""``python -m kernels_bench trace <command>``: build, convert, check, judge and describe
traces."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from router.config.cluster import ConfigError
from router.trace_format import TraceFormatError


def build(argv: list[str]) -> None:
    """``trace build``: run a cluster's models over a suite's workflows (``trace.build``)."""
    from kernels_bench.lab.trace.build import Settings
    from kernels_bench.lab.trace.build import build as build_trace
    from kernels_bench.lab.trace.workflows import WORKFLOWS

    ap = argparse.ArgumentParser(
        prog="python -m kernels_bench trace build",
        description="Run every model of a cluster over a suite's workflows (resumable).")
    ap.add_argument("--cluster", type=Path, required=True, help="cluster.toml: the models")
    ap.add_argument("--suite", choices=sorted(WORKFLOWS), required=True)
    ap.add_argument("--problems", type=int, required=True, help="number of problems")
    ap.add_argument("--out", type=Path, required=True, help="trace file (.jsonl or .jsonl.gz)")
    ap.add_argument("--models", nargs="+", help="engine names to run (default: all, in order)")
    ap.add_argument("--workflows", nargs="+", help="workflow ids (default: all of the suite)")
    ap.add_argument("--seed", type=int, default=0, help="problem and sampling seed")
    ap.add_argument("--max-tokens", type=int, default=512, help="output cap per stage")
    ap.add_argument("--concurrency", type=int, default=32, help="workflow runs in flight")
    ap.add_argument("--code-timeout", type=float, default=10.0, help="seconds per test run")
    ap.add_argument("--samples", type=int, default=0,
                    help="sampled runs per (problem, workflow, model), beside the greedy run "
                         "(default 0; a larger K later runs only the new ones)")
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="the sampled runs' temperature (default 0.7)")
    ap.add_argument("--top-p", type=float, default=0.95,
                    help="the sampled runs' top_p (default 0.95)")
    args = ap.parse_args(argv)
    if args.samples < 0:
        ap.error("--samples must be >= 0")
    if not (args.temperature > 0 and 0 < args.top_p <= 1):
        ap.error("--temperature must be > 0 and --top-p in (0, 1]")
    workflows = args.workflows or list(WORKFLOWS[args.suite])
    bad = sorted(set(workflows) - set(WORKFLOWS[args.suite]))
    if bad:
        ap.error(f"--workflows: {bad} not in {args.suite}'s {list(WORKFLOWS[args.suite])}")
    s = Settings(args.suite, args.problems, args.seed, args.max_tokens, args.concurrency,
                 args.code_timeout, args.samples, args.temperature, args.top_p)
    command = shlex.join(["python", "-m", "kernels_bench", "trace", "build", *argv])
    build_trace(args.cluster, s, args.out, args.models, workflows, command)


def champ(argv: list[str]) -> None:
    """``trace champ``: champ-dataset's recorded answers as a trace (``trace.champ``)."""
    from kernels_bench.lab.trace.champ import convert
    from kernels_bench.lab.trace.models import real_models_root

    ap = argparse.ArgumentParser(
        prog="python -m kernels_bench trace champ",
        description="Convert champ-dataset's recorded API-model answers into a trace.")
    ap.add_argument("--tokenizer", default="qwen2.5-coder-0.5b-instruct",
                    help="tokenizer used to count tokens: a local folder, or the name of a "
                         "model fetched by python -m kernels_bench.lab.studies."
                         "fetch_real_models (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True, help="trace file (.jsonl.gz)")
    args = ap.parse_args(argv)
    command = shlex.join(["python", "-m", "kernels_bench", "trace", "champ", *argv])
    tokenizer = Path(args.tokenizer).expanduser()
    if not tokenizer.is_dir():
        tokenizer = real_models_root() / args.tokenizer
        if not tokenizer.is_dir():
            ap.error(f"--tokenizer {args.tokenizer}: no such folder, and no fetched model of "
                     f"that name in {tokenizer.parent} (run python -m "
                     "kernels_bench.lab.studies.fetch_real_models)")
    written, skipped = convert(str(tokenizer), args.out, command)
    print(f"{written} units -> {args.out} ({skipped} conversations without a summary skipped)")


def agent(argv: list[str]) -> None:
    """``trace agent``: synthetic long-context agent programs (``trace.agent``)."""
    from kernels_bench.lab.trace.agent import AgentSettings, generate, parse_range, summary

    d = AgentSettings()
    ap = argparse.ArgumentParser(
        prog="python -m kernels_bench trace agent",
        description="Write a trace of synthetic long-context agent programs (made-up texts "
                    "and outcomes: for latency and KV measures, with --context chat).")
    ap.add_argument("--out", type=Path, required=True, help="trace file (.jsonl.gz)")
    ap.add_argument("--programs", type=int, default=d.programs, help="default %(default)s")
    ap.add_argument("--stages", type=int, default=d.stages,
                    help="stages per program, the first reads the context (default %(default)s)")
    for name, what in (("context", "stage 0's context"), ("tool", "each tool output"),
                       ("output", "each answer")):
        lo, hi = getattr(d, name)
        ap.add_argument(f"--{name}", default=f"{lo}-{hi}", metavar="LO-HI",
                        help=f"tokens of {what}, uniform (default %(default)s)")
    ap.add_argument("--seed", type=int, default=d.seed, help="default %(default)s")
    ap.add_argument("--model", default=d.model,
                    help="whose tokenizer counts tokens (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        s = AgentSettings(args.programs, args.stages, parse_range(args.context),
                          parse_range(args.tool), parse_range(args.output), args.seed,
                          args.model)
        s.check()
    except ValueError as e:
        ap.error(str(e))
    command = shlex.join(["python", "-m", "kernels_bench", "trace", "agent", *argv])
    print(f"{args.out}: {summary(generate(s, args.out, command))}")


def datasheet(argv: list[str]) -> None:
    """``trace datasheet``: the datasheet of trace files (``trace.datasheet``)."""
    from kernels_bench.lab.trace.datasheet import plot, render, summarize
    from router.trace_format import load_trace

    ap = argparse.ArgumentParser(
        prog="python -m kernels_bench trace datasheet",
        description="Write the datasheet (Markdown, JSON, PNG) of trace files.")
    ap.add_argument("traces", nargs="+", type=Path, help="trace files")
    ap.add_argument("--out", type=Path, required=True, help="Markdown file to write")
    ap.add_argument("--title", default="Workflow traces: datasheet")
    args = ap.parse_args(argv)
    traces = [load_trace(p) for p in args.traces]
    summaries = [summarize(t, p) for t, p in zip(traces, args.traces)]
    regenerate = shlex.join(["python", "-m", "kernels_bench", "trace", "datasheet", *argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(summaries, args.title, regenerate))
    args.out.with_suffix(".json").write_text(json.dumps(summaries, indent=1) + "\n")
    plot(summaries, traces, args.out.with_suffix(".png"))
    print(f"wrote {args.out}, {args.out.with_suffix('.json')}, {args.out.with_suffix('.png')}")


def rejudge(argv: list[str]) -> None:
    """``trace rejudge``: judge a finished trace again (``trace.rejudge``)."""
    from kernels_bench.lab.trace.rejudge import problems_of
    from kernels_bench.lab.trace.rejudge import rejudge as judge_again
    from router.trace_format import read_records, write_records

    ap = argparse.ArgumentParser(
        prog="python -m kernels_bench trace rejudge",
        description="Judge every unit of a finished trace again from its recorded outputs.")
    ap.add_argument("trace", type=Path, help="trace file (math or code)")
    ap.add_argument("--out", type=Path, help="where to write (default: replace TRACE, "
                    "atomically; never while a build appends to it)")
    args = ap.parse_args(argv)
    header, units = read_records(args.trace)
    timeout_s = float(header.settings.get("code_timeout_s", 10.0))
    judged, changes = judge_again(units, problems_of(header, units), timeout_s)
    out = args.out or args.trace
    write_records(out, header, judged)
    said = ", ".join(f"{k} {v}" for k, v in changes.items()) or "no change"
    print(f"{len(judged)} units judged again -> {out}: {said}")


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
        sampled = sum(len(v) for r in t.runs for v in r.samples.values())
        print(f"ok {f}: suite {t.header.suite}, {len(t.runs)} workflow runs, {units} units"
              + (f" and {sampled} sampled runs" if sampled else "")
              + f", models {', '.join(t.models)}")
    if failed:
        sys.exit(1)


def compact(argv: list[str]) -> None:
    """``trace compact SRC [SRC ...] DST [--without FILE] [--workflows W ...]``: one gzip
    member, units sorted by key; several SRC merged."""
    from router.trace_format import compact as do_compact

    ap = argparse.ArgumentParser(prog="python -m kernels_bench trace compact")
    ap.add_argument("src", type=Path, nargs="+",
                    help="trace(s); several made with the same settings are merged")
    ap.add_argument("dst", type=Path)
    ap.add_argument("--without", type=Path,
                    help="a trace whose problems are left out (keeps what SRC adds to it)")
    ap.add_argument("--workflows", nargs="+", metavar="W",
                    help="keep only these workflows (e.g. solve)")
    args = ap.parse_args(argv)
    print(f"{do_compact(args.src, args.dst, args.without, args.workflows)} units -> {args.dst}")


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], None], str]] = {
    "build": (build, "run a cluster's models over a suite's workflows"),
    "champ": (champ, "convert champ-dataset into a trace"),
    "agent": (agent, "write synthetic long-context agent programs"),
    "datasheet": (datasheet, "write the datasheet of trace files"),
    "rejudge": (rejudge, "judge a finished trace again from its outputs"),
    "validate": (validate, "check trace files"),
    "compact": (compact, "recompress a trace (one gzip member, sorted)"),
}


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m kernels_bench trace <command> [options]\n\ncommands:")
        for name, (_, desc) in SUBCOMMANDS.items():
            print(f"  {name:10} {desc}")
        return
    if argv[0] not in SUBCOMMANDS:
        sys.exit(f"unknown trace command {argv[0]!r}; see --help")
    try:
        SUBCOMMANDS[argv[0]][0](argv[1:])
    except (TraceFormatError, ConfigError, OSError) as e:
        sys.exit(f"trace {argv[0]}: error: {e}")
