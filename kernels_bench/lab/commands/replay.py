"""``python -m kernels_bench replay``: compare routing and scheduling policies by replaying
a workflow trace through a real cluster. See docs/research/replay.md."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from kernels_bench.lab.replay.arrivals import PROCESSES
from kernels_bench.lab.replay.client import RETRY_ON
from kernels_bench.lab.replay.gaps import parse_tool_gap
from kernels_bench.lab.replay.output import RESULTS_ROOT, SUMMARY, TWIN_ROOT
from kernels_bench.lab.replay.report import markdown_tables
from kernels_bench.lab.replay.run import ReplayOptions, replay
from kernels_bench.lab.replay.spec import STOCK_PREFIX, SpecError, parse_policies
from kernels_bench.lab.replay.workload import CONTEXTS, PROBLEMS, WorkloadError, merge_traces
from kernels_bench.lab.trace.suites import examples_verdicts
from kernels_bench.lib.cluster import ClusterError
from kernels_bench.lib.model_map import parse_model_map
from launcher import LaunchError
from launcher.settings import LaunchConfig, load_launch_config
from router.config.cluster import ConfigError
from router.config.engines import SCHED_POLICIES, STOCK_SCHED_POLICIES
from router.policies import POLICIES
from router.predictors.artifact import METADATA_FILE
from router.predictors.kinds import KINDS
from router.trace_format import Trace, TraceFormatError, load_trace

MAIN_POLICIES = ["chimera:stjf", "chimera:fcfs", "lmetric", "routebalance", "laar",
                 "vllm:fcfs", "round_robin", "oracle"]
BASELINE = "vllm:fcfs"


def build_parser(prog: str = "python -m kernels_bench replay", description: str = "",
                 live: bool = True) -> argparse.ArgumentParser:
    """The replay's options; ``live=False``: without those of live engines (the twin's)."""
    p = argparse.ArgumentParser(
        prog=prog, description=description or __doc__.split("\n\n")[0],
        epilog="Policy specs: ROUTER[:SCHED][+oracle][@KEY=VALUE,...]; 'oracle' = "
        "chimera:stjf+oracle. SCHED sets every engine's scheduler (stjf, fcfs, priority, "
        "mlfq); without it the cluster file's applies. KEY: a setting of the router policy, "
        "or an engine's KV retention key (max_protected_programs, retention_ttl_only, ...).")
    p.add_argument("--cluster", type=Path, required=True, help="cluster file (TOML)")
    p.add_argument("--trace", type=Path, nargs="+", required=True, metavar="TRACE",
                   help="workflow trace(s) (.jsonl[.gz]); several are replayed as one mixed "
                   "workload (e.g. math and code)")
    p.add_argument("--artifacts", type=Path, metavar="DIR",
                   help="trained predictors (python -m kernels_bench artifacts: one folder "
                   "per predictor, or fold-k/ folders of them to cross-fit) for every "
                   "policy that routes on them; '-static' specs run on static priors "
                   "instead")
    p.add_argument("--policies", nargs="+", default=MAIN_POLICIES, metavar="SPEC",
                   help=f"policies to compare (default: {' '.join(MAIN_POLICIES)})")
    p.add_argument("--rates", nargs="+", type=float, default=[1.0], metavar="R",
                   help="arrival rates, workflows per second (default: 1)")
    p.add_argument("--arrival", choices=PROCESSES, default="poisson")
    p.add_argument("--cv", type=float, default=2.0,
                   help="coefficient of variation of gamma gaps (--arrival gamma)")
    p.add_argument("--workflows", type=int, default=100, help="workflows per run")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    p.add_argument("--model-map", action="append", default=[], metavar="SERVED=TRACE,...",
                   help="trace model replayed by each served model (default: same name)")
    p.add_argument("--tool-gap", default="none", metavar="DIST[:P1,P2]",
                   help="the agent's time between a program's calls, seeded by --seed: "
                   "none (default), fixed:S, exp:MEAN, uniform:LO,HI, lognormal:MEDIAN,SIGMA "
                   "(seconds), or trace (the trace's tool_gap_s); the client announces each "
                   "gap to the router as the call's expected_return_s")
    p.add_argument("--context", choices=CONTEXTS, default="trace",
                   help="stage context: the trace's messages (default), or chat: one "
                   "growing conversation, each stage's prompt extending the previous one's")
    p.add_argument("--retries", type=int, default=0, metavar="R",
                   help="retry a failed workflow (--retry-on) up to R times")
    p.add_argument("--retry-on", choices=RETRY_ON, default="wrong",
                   help="what a retry follows: a wrong answer (default; the trace's verdict, "
                   "which no agent has: time to a correct answer), or examples: a program "
                   "that fails the examples its prompt states (code problems; none "
                   "elsewhere), as an agent that tests its code before answering")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run every policy and rate N times, interleaved (policy order "
                   "rotated every repeat); 95%% intervals come from the repeats and the "
                   "workflows (default 1)")
    p.add_argument("--problems", choices=PROBLEMS, default="held-out",
                   help="with predictor artifacts: replay the problems every artifact's split "
                   "held out (default), those they trained on (to tune settings without "
                   "touching the evaluated problems), or all")
    if live:
        p.add_argument("--run-attempts", type=int, default=3, metavar="N",
                       help="run a policy and rate again, up to N times in all, while the "
                       "router marks an engine down during it (default 3)")
    p.add_argument("--priors-from-trace", action="store_true",
                   help="fill the static-prior tables a policy with static_prior = true "
                   "leaves out (confidence, quality, capability, mean_output_tokens) from "
                   "the trace")
    p.add_argument("--baseline", default=BASELINE, help=f"ratio reference (default {BASELINE})")
    p.add_argument("--out", type=Path, help="output folder (default: "
                   f"{RESULTS_ROOT if live else TWIN_ROOT}/<timestamp>)")
    if live:
        p.add_argument("--run-dir", type=Path, help="engine and router logs and sockets "
                       "(default: <out>/cluster)")
    return p


def portable(arg: str) -> str:
    """An argument as the results may show it: an absolute path relative to the current
    folder when inside it, else by its name only (no path of this machine)."""
    path = Path(arg)
    if not path.is_absolute():
        return arg
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return path.name


def artifact_folders(root: Path) -> list[dict[str, str]]:
    """Per fold (``root/fold-k``, k = 0, 1, ...; else ``root`` itself as one), predictor
    name -> folder of every artifact in it; telemetry-trained ones (``tpot``) in ``root``
    beside fold folders serve every fold. ValueError if none, or on both layouts."""
    def found(folder: Path) -> dict[str, str]:
        return {k: str((folder / k).resolve()) for k in KINDS
                if (folder / k / METADATA_FILE).is_file()}

    folds = []
    while (root / f"fold-{len(folds)}").is_dir():
        folds.append(found(root / f"fold-{len(folds)}"))
    here = found(root)
    shared = {k: f for k, f in here.items() if KINDS[k].telemetry}
    if folds and set(here) - set(shared):
        raise ValueError(f"--artifacts {root}: holds both predictor folders and fold-k "
                         "folders; give one fold's folder or a folder of folds")
    empty = [f"fold-{k}" for k, f in enumerate(folds) if not f]
    if not folds and not here or empty:
        raise ValueError(f"--artifacts {root}: no predictor artifact in "
                         f"{empty[0] if empty else 'it'} (expected <predictor>/"
                         f"{METADATA_FILE}; python -m kernels_bench artifacts [--folds K])")
    return [{**shared, **f} for f in folds] or [here]


def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops a replay like Ctrl-C: the cluster is brought down, results kept."""
    raise KeyboardInterrupt


def check_args(parser: argparse.ArgumentParser, a: argparse.Namespace,
               root: Path = RESULTS_ROOT) -> Path:
    """Exit with usage on out-of-range numbers or a used ``--out``; the output folder
    (default: a new one under ``root``)."""
    if (min(a.workflows, getattr(a, "run_attempts", 1), a.repeats) < 1 or a.retries < 0
            or any(r <= 0 for r in a.rates)):
        parser.error("--workflows, --repeats and --run-attempts must be >= 1, --retries >= 0 "
                     "and every rate > 0")
    out: Path = a.out or root / time.strftime("%Y%m%d-%H%M%S")
    if (out / SUMMARY).exists():
        parser.error(f"{out} already holds a replay; give another --out")
    return out


def replay_options(a: argparse.Namespace, out: Path) -> ReplayOptions:
    """The options of the parsed command line (SpecError, ValueError: a bad value)."""
    return ReplayOptions(
        policies=parse_policies(a.policies, POLICIES, [
            *SCHED_POLICIES, *(STOCK_PREFIX + p for p in STOCK_SCHED_POLICIES)]), rates=a.rates,
        arrival=a.arrival, cv=a.cv, workflows=a.workflows, seed=a.seed,
        model_map=parse_model_map(a.model_map), max_attempts=a.retries + 1,
        run_attempts=getattr(a, "run_attempts", 1), repeats=a.repeats, problems=a.problems,
        artifacts=artifact_folders(a.artifacts) if a.artifacts else [],
        priors_from_trace=a.priors_from_trace, baseline=a.baseline, out=out,
        run_dir=getattr(a, "run_dir", None) or out / "cluster",
        tool_gaps=parse_tool_gap(a.tool_gap, a.seed), context=a.context,
        retry_on=a.retry_on, examples_check=examples_verdicts)


Runner = Callable[[LaunchConfig, Trace, str, ReplayOptions, str], dict[str, Any]]
"""Runs a replay (live, or the twin's): cluster, merged trace, its name, options, the
command line as the results show it; the summary."""


def run_replay(name: str, argv: list[str], a: argparse.Namespace, out: Path,
               run: Runner) -> None:
    """Load the cluster and the traces, ``run`` (SIGTERM stops it as Ctrl-C does), print
    the tables; every error one line."""
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        opts = replay_options(a, out)
        cfg = load_launch_config(a.cluster)
        trace = merge_traces([load_trace(t) for t in a.trace])
        command = f"python -m kernels_bench {name} " + shlex.join(map(portable, argv))
        summary = run(cfg, trace, "+".join(t.name for t in a.trace), opts, command)
    except (ConfigError, SpecError, WorkloadError, TraceFormatError, ClusterError,
            LaunchError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("\n" + markdown_tables(summary))
    print(f"\nwrote {out} (requests, workflows, summary, plots); `python -m kernels_bench "
          f"results --run {out}` turns it into a results page")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    a = parser.parse_args(argv)
    run_replay("replay", argv, a, check_args(parser, a), replay)
