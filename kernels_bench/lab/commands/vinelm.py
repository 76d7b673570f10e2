"""``python -m kernels_bench vinelm``: profile workflow tries, and the synthetic experiments.

    python -m kernels_bench vinelm profile --config cluster.toml --workflow math \\
        --executor engines --url http://127.0.0.1:8000 --suite math --problems 200 \\
        --out vinelm-profile.json
    python -m kernels_bench vinelm profile ... --executor trace --trace data/traces/math.jsonl.gz
    python -m kernels_bench vinelm profile ... --executor synthetic --problems 300
    python -m kernels_bench vinelm experiment --config cluster.toml --workflow math --out DIR

The templates, prices and profiling settings come from the cluster file's
``[router.policies.vinelm]`` table (docs/research/vinelm.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kernels_bench.lab.vinelm.executions import RecordedExecutor, read_executions
from kernels_bench.lab.vinelm.executors import EngineExecutor, Prices, trace_table
from kernels_bench.lab.vinelm.experiment import (frontier_experiment, profiling_experiment,
                                                 recorded_experiment, slo_experiment, write)
from router.config.cluster import ConfigError, load_cluster_config
from router.policies.registry import validate_settings
from router.policies.vinelm import VineLMSettings
from router.vinelm.estimate import EstimationSettings, annotate
from router.vinelm.profiling import Executor, MissingExecution, cascade_sample
from router.vinelm.synthetic import default_env
from router.vinelm.template import WorkflowTemplate, parse_templates
from router.vinelm.trie import save_tries


def _settings(config: str) -> VineLMSettings:
    cfg = load_cluster_config(config)
    table = cfg.router.policies.get("vinelm")
    if table is None:
        raise SystemExit(f"{config}: no [router.policies.vinelm] table")
    settings: VineLMSettings = validate_settings("vinelm", table)
    return settings


def _templates(s: VineLMSettings, names: str) -> list[WorkflowTemplate]:
    templates = parse_templates(s.workflows)
    out = []
    for n in names.split(","):
        if n not in templates:
            raise SystemExit(f"--workflow {n!r}: no such template; templates: "
                             f"{', '.join(templates) or 'none'}")
        out.append(templates[n])
    return out


def _executor(args: argparse.Namespace, t: WorkflowTemplate, s: VineLMSettings
              ) -> tuple[Executor, list[str]]:
    invs = t.invocations()
    if args.executor == "synthetic":
        return default_env(invs, args.seed), [f"synthetic/{i}" for i in range(args.problems)]
    prices = Prices(s.prompt_cost_per_1k, s.output_cost_per_1k)
    prices.check(t.models())
    if args.executor == "trace":
        if not args.trace:
            raise SystemExit("--executor trace needs --trace FILE")
        from router.trace_format import load_trace

        executor, problems = trace_table(load_trace(args.trace), invs, prices)
        return executor, problems[:args.problems]
    if not (args.url and args.suite):
        raise SystemExit("--executor engines needs --url (a router or server serving every "
                         "admissible model) and --suite")
    from kernels_bench.lab.trace.suites import load_problems

    problems = {p.id: p for p in load_problems(args.suite, args.problems, args.seed)}
    return EngineExecutor(args.url, args.suite, problems, invs, prices, args.max_tokens,
                          args.seed), list(problems)


def cmd_profile(args: argparse.Namespace) -> None:
    s = _settings(args.config)
    est = EstimationSettings(s.smooth_rank, s.smooth_depths, s.smooth_strength)
    tries: dict[str, Any] = {}
    for t in _templates(s, args.workflow):
        executor, problems = _executor(args, t, s)
        try:
            obs = cascade_sample(executor, t.invocations(), problems, s.cascades_per_problem,
                                 s.seed, progress=True)
        except MissingExecution as e:
            raise SystemExit(f"{e}. The trace executor knows single-model runs only: profile "
                             "mixed-model paths with --executor engines") from None
        trie = annotate(t.name, t.invocations(), obs, est)
        nodes = len(trie.nodes) - 1
        info = {"executor": args.executor, "problems": len(problems),
                "cascades_per_problem": s.cascades_per_problem, "executions": obs.executions,
                "exhaustive_executions": nodes * len(problems),
                "execution_fraction": obs.executions / (nodes * len(problems)),
                "smooth_rank": s.smooth_rank, "smooth_depths": s.smooth_depths,
                "smooth_strength": s.smooth_strength,
                "seed": s.seed}
        tries[t.name] = trie.to_json(t, info)
        print(json.dumps({"workflow": t.name, **info}))
    save_tries(args.out, tries)
    print(f"wrote {args.out}")


def cmd_experiment(args: argparse.Namespace) -> None:
    s = _settings(args.config)
    est = EstimationSettings(s.smooth_rank, s.smooth_depths, s.smooth_strength)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in _templates(s, args.workflow):
        if args.executions:
            report = _recorded_report(args, t, s, est)
        else:
            report = _synthetic_report(args, t, s, est)
        path = out_dir / f"vinelm-{t.name}.json"
        write(report, path)
        print(json.dumps(report, indent=1))
        print(f"wrote {path} and {path.with_suffix('.png')}")


def _synthetic_report(args: argparse.Namespace, t: WorkflowTemplate, s: VineLMSettings,
                      est: EstimationSettings) -> dict[str, Any]:
    env = default_env(t.invocations(), args.seed)
    train = [f"train/{i}" for i in range(args.problems)]
    test = [f"test/{i}" for i in range(args.test_problems)]
    report, sparse, truth = profiling_experiment(t, env, train, s.cascades_per_problem,
                                                 est, s.seed)
    slowed = max(env.cost, key=lambda m: env.cost[m])
    return {"workflow": t.name, "seed": args.seed, "profiling": report,
            "frontier": frontier_experiment(t, env, sparse, truth, test),
            "slo": slo_experiment(t, env, sparse, test, slowed, args.slow_factor,
                                  args.slow_share, args.seed)}


def _recorded_report(args: argparse.Namespace, t: WorkflowTemplate, s: VineLMSettings,
                     est: EstimationSettings) -> dict[str, Any]:
    header, table = read_executions(args.executions)
    if header.workflow != t.name or header.signature != t.signature():
        raise SystemExit(f"{args.executions}: collected for {header.workflow} "
                         f"{header.signature}, not template {t.name} {t.signature()}")
    prices = Prices(s.prompt_cost_per_1k, s.output_cost_per_1k)
    prices.check(t.models())
    env = RecordedExecutor(table, prices)
    problems = [p for p in env.problems() if env.complete(p, t.invocations())]
    if len(problems) < 2 * args.folds:
        raise SystemExit(f"{args.executions}: {len(problems)} problems have every node "
                         f"recorded; {args.folds} folds need at least {2 * args.folds}")
    report = recorded_experiment(t, env, problems, s.cascades_per_problem, est, s.seed,
                                 args.folds, args.slow_factor, args.slow_share)
    return {"workflow": t.name, "environment": f"real executions of {len(problems)} "
            f"{header.suite} problems", "executions": str(args.executions),
            "seed": s.seed, **report}


def cmd_collect(args: argparse.Namespace) -> None:
    import shlex

    from kernels_bench.lab.trace.build import Settings
    from kernels_bench.lab.vinelm.collect import collect

    s = _settings(args.config)
    (t,) = _templates(s, args.workflow)
    settings = Settings(args.suite, args.problems, args.seed, args.max_tokens,
                        args.concurrency, args.code_timeout)
    command = shlex.join(["python", "-m", "kernels_bench", "vinelm", *args.argv])
    collect(Path(args.config), t, settings, Path(args.out),
            Path(args.trace) if args.trace else None, command)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kernels_bench vinelm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile", help="cascade-profile workflow tries into a profile file")
    p.add_argument("--config", required=True, help="cluster file with [router.policies.vinelm]")
    p.add_argument("--workflow", required=True, help="template name(s), comma-separated")
    p.add_argument("--executor", choices=("engines", "trace", "synthetic"), required=True)
    p.add_argument("--trace", help="trace file (--executor trace)")
    p.add_argument("--url", help="router or server URL (--executor engines)")
    p.add_argument("--suite", choices=("math", "code"), help="problem suite (engines)")
    p.add_argument("--problems", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0, help="problem / environment seed")
    p.add_argument("--out", required=True)
    e = sub.add_parser("experiment", help="sparse vs exhaustive profiling, frontier and SLO "
                       "on the synthetic environment or recorded executions (JSON + PNG)")
    e.add_argument("--config", required=True)
    e.add_argument("--workflow", required=True)
    e.add_argument("--problems", type=int, default=300, help="profiled problems")
    e.add_argument("--test-problems", type=int, default=500)
    e.add_argument("--executions", help="recorded real executions (`collect`) instead of "
                   "the synthetic environment")
    e.add_argument("--folds", type=int, default=5, help="cross-fitting folds (--executions)")
    e.add_argument("--slow-factor", type=float, default=4.0)
    e.add_argument("--slow-share", type=float, default=0.3)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--out", default="bench_results")
    c = sub.add_parser("collect", help="real executions of every trie node (until success) "
                       "on the cluster's engines, resumable (for profiling and ground truth)")
    c.add_argument("--config", required=True,
                   help="cluster file: the engines and [router.policies.vinelm]")
    c.add_argument("--workflow", required=True, help="one template name")
    c.add_argument("--suite", choices=("math", "code"), required=True)
    c.add_argument("--problems", type=int, required=True, help="the suite's first N problems")
    c.add_argument("--trace", help="trace built with the same settings: single-model nodes "
                   "are taken from it instead of run")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--max-tokens", type=int, default=512)
    c.add_argument("--concurrency", type=int, default=32, help="calls in flight per engine")
    c.add_argument("--code-timeout", type=float, default=10.0)
    c.add_argument("--out", required=True, help="executions file (.jsonl or .jsonl.gz)")
    args = ap.parse_args(argv)
    if args.cmd == "experiment" and args.folds < 2:
        ap.error("--folds must be at least 2 (each fold is held out from the others)")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        {"profile": cmd_profile, "experiment": cmd_experiment,
         "collect": cmd_collect}[args.cmd](args)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

