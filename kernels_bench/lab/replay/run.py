"""One replay: every policy at every rate on the same workload, results written as it goes.

The workload (trace runs and, per rate, arrival times) is drawn once from the seed, so
every policy replays exactly the same workflows at the same times. Every (policy, rate) runs
``repeats`` times, interleaved (``schedule``): repeat after repeat, policies sharing engine
settings back to back on the same engines, the order rotated every repeat.

With cross-fitted predictor artifacts (``kernels_bench artifacts --folds K``) a repeat runs
every (policy, rate) once per fold: fold k's routers route on fold k's predictors and
replay ``workflows`` runs of the problems fold k held out (its static priors average the
problems it trained on), so every problem is replayed by predictors that never saw it and
the intervals pool the folds' workflows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import platform
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from kernels_bench.lab.replay.arrivals import arrival_times
from kernels_bench.lab.replay.client import (AgenticClient, ClientSettings, http_sender,
                                             outcome_poster, run_clock)
from kernels_bench.lab.replay.gaps import ToolGaps, check_trace_gaps
from kernels_bench.lab.replay.metrics import summarize
from kernels_bench.lab.replay.output import write_run, write_summary
from kernels_bench.lab.replay.spec import STATIC, PolicySpec
from kernels_bench.lab.replay.workload import Job, draw_samples, select_runs
from kernels_bench.lib import engine_metrics as em
from kernels_bench.lib.cluster import BenchCluster, engine_variant
from kernels_bench.lib.model_map import resolve_model_map
from kernels_bench.lib.priors import fill_static_priors, trace_priors
from launcher.settings import LaunchConfig
from router.config.cluster import ClusterConfig, RouterConfig, parse_cluster_config
from router.config.engines import EngineConfig, LocalEngine, RemoteEngine
from router.policies.registry import POLICIES, build_policy
from router.predictors.artifact import split_of
from router.predictors.base import PredictorSet
from router.predictors.loader import PROFILES
from router.predictors.records import Split
from router.trace_format import Trace, WorkflowRun
from router.types import ClusterInfo


ExamplesCheck = Callable[[WorkflowRun, Sequence[str]], Mapping[str, bool | None]]
"""(run, trace models) -> per model, whether its final program passes its prompt's examples
(None: no examples to run)."""


@dataclass(frozen=True)
class ReplayOptions:
    policies: list[PolicySpec]
    rates: list[float]
    arrival: str
    cv: float
    workflows: int
    seed: int
    model_map: dict[str, str]
    """As given on the command line (served -> trace model); resolved against both."""
    max_attempts: int
    run_attempts: int
    """Runs of a policy and rate, in all, while the router marks an engine down in them."""
    priors_from_trace: bool
    baseline: str
    repeats: int
    """Runs of every (policy, rate), interleaved; intervals need at least 2."""
    problems: str
    """Which problems to replay, given the artifacts' splits (``workload.PROBLEMS``)."""
    artifacts: list[dict[str, str]]
    """Per fold, predictor name -> artifact folder (``--artifacts``) for the non-static
    specs: one set for a single split, K for cross-fitting, none without artifacts."""
    out: Path
    run_dir: Path
    """Where the engines' and routers' logs and sockets go."""
    tool_gaps: ToolGaps = ToolGaps()
    """The agent's time between a program's calls (``--tool-gap``; default none)."""
    context: str = "trace"
    """The stages' context form (``--context``, ``workload.CONTEXTS``)."""
    retry_on: str = "wrong"
    """What a retry follows (``--retry-on``, ``client.RETRY_ON``)."""
    examples_check: ExamplesCheck | None = None
    """With ``retry_on = "examples"``: per trace model, whether a run's final program
    passes its prompt's examples (``trace.suites.examples_verdicts``, given by the command
    layer: the replay does not import the trace builder)."""


def client_settings(opts: ReplayOptions, spec: PolicySpec,
                    model_map: dict[str, str]) -> ClientSettings:
    """The agentic client of one run of ``spec``."""
    return ClientSettings(model_map, spec.oracle, opts.max_attempts, opts.tool_gaps,
                          opts.context, opts.retry_on)


def served_models(cfg: ClusterConfig) -> list[str]:
    return list(dict.fromkeys(e.served_model_name for e in cfg.engines))


def router_variant(cfg: ClusterConfig, spec: PolicySpec,
                   priors: dict[str, dict[str, float]] | None,
                   artifacts: Mapping[str, str] | None = None) -> RouterConfig:
    """The router of a run: the spec's policy, oracle priorities allowed, the file's
    settings with the spec's over them (``POLICY.KEY``: that policy's table), the
    predictors the policy routes on from ``artifacts`` (a ``-static`` spec: none,
    ``static_prior = true`` instead), trace priors filled in when given."""
    tables: dict[str, dict[str, Any]] = {k: dict(v) for k, v in
                                         cfg.router.policies.items()}
    predictors = dict(cfg.router.predictors)
    for key, value in spec.overrides:
        table, dot, name = key.partition(".")
        table, name = (table, name) if dot else (spec.router, key)
        tables[table] = {**tables.get(table, {}), name: value}
    used = POLICIES[spec.router].predictors_for(tables.get(spec.router, {}))
    if spec.static:
        tables[spec.router] = {**tables.get(spec.router, {}), "static_prior": True}
        predictors = {k: v for k, v in predictors.items() if k not in used}
    elif artifacts:
        predictors.update({k: artifacts[k] for k in used if k in artifacts})
    if priors is not None:
        tables = fill_static_priors(tables, priors)
    return dataclasses.replace(
        cfg.router, policy=spec.router, policies=tables, predictors=predictors,
        allow_client_priority=cfg.router.allow_client_priority or spec.oracle)


def spec_inputs(router: RouterConfig) -> dict[str, Any]:
    """What a run's policy routes on: its trained predictors, and whether static priors
    fill in for the rest."""
    used = POLICIES[router.policy].predictors_for(router.policies.get(router.policy, {}))
    return {"predictors": sorted(k for k in router.predictors if k in used),
            "static_prior": bool(router.policies.get(router.policy, {}).get("static_prior"))}


def check_variant(cfg: ClusterConfig, router: RouterConfig, spec: PolicySpec) -> None:
    """Fail before any engine starts if the router could not start with ``router``: bad
    settings, (when no predictor artifacts are configured) a missing static table, or a
    spec whose name would misstate what it routes on."""
    label = spec.label
    used = POLICIES[spec.router].predictors_for(router.policies.get(spec.router, {}))
    if spec.static and not used:
        raise ValueError(f"policy {label!r}: {spec.router} routes on no trained predictor; "
                         f"drop '-static'")
    if not spec.static and used and not set(used) & set(router.predictors):
        head = re.match(r"[^:+@]*", label).group()  # type: ignore[union-attr]
        static = f"{head}{STATIC}{label[len(head):]}"
        raise ValueError(f"policy {label!r} routes on trained predictors "
                         f"({', '.join(used)}) and none is given: pass --artifacts DIR "
                         f"(make artifacts), or compare the static-prior ablation {static!r}")
    draft = dataclasses.replace(cfg, router=router)
    parse_cluster_config(draft.to_dict(), cfg.source, Path(cfg.source).resolve().parent)
    if router.predictors:
        return  # the router loads and checks them at start-up
    engines = {name: e.served_model_name for e in cfg.engines
               for name in ([e.name] if e.remote else
                            [f"{e.name}-{i}" for i in range(e.replicas)])}
    try:
        build_policy(router.policy, router.policies, ClusterInfo(engines),
                     PredictorSet())
    except ValueError as e:
        hint = ("" if "static_prior" not in str(e) else "; --priors-from-trace fills "
                "confidence, quality, capability and mean_output_tokens from the trace")
        raise ValueError(f"policy {label!r}: {e}{hint}") from None


def trained_splits(routers: Iterable[RouterConfig]) -> list[Split]:
    """The split of every problem-trained predictor artifact the routers load
    (telemetry-trained ``tpot`` ones split engine samples, not problems)."""
    out = []
    folders = {f for r in routers for k, f in r.predictors.items() if k != PROFILES}
    for folder in sorted(folders):
        kind, split = split_of(folder)
        if kind != "tpot":
            out.append(split)
    return sorted(set(out))


def prior_runs(trace: Trace, traced_models: Sequence[str],
               splits: Sequence[Split]) -> list[WorkflowRun]:
    """The runs static priors average over: those of the problems the artifacts trained
    on when there are artifacts (priors then see no replayed problem), else every run."""
    runs = trace.complete_runs(traced_models)
    trained = [r for r in runs if not any(s.holds_out(r.problem_id) for s in splits)]
    return trained if splits and trained else runs


def make_jobs(trace: Trace, traced_models: Sequence[str], opts: ReplayOptions,
              splits: Sequence[Split] = (), first: int = 0) -> dict[float, list[Job]]:
    """Per rate, the jobs: the same seeded runs (of problems every split held out; one
    recorded sample per model where the trace has samples, ``draw_samples``), arrivals
    drawn with the seed; job ids numbered from ``first``."""
    runs = select_runs(trace, traced_models, opts.workflows, opts.seed, splits, opts.problems)
    ids = [f"w{first + i:04d}" for i in range(len(runs))]
    drawn = [draw_samples(run, opts.seed, job) for job, run in zip(ids, runs)]
    examples: list[dict[str, bool | None]] = [{} for _ in drawn]
    if opts.retry_on == "examples" and opts.max_attempts > 1:
        check = opts.examples_check
        if check is None:
            raise ValueError("--retry-on examples needs ReplayOptions.examples_check")
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            examples = list(tqdm(pool.map(lambda r: check(r, traced_models), drawn),
                                 total=len(drawn), desc="prompt examples", leave=False))
    out = {}
    for rate in opts.rates:
        times = arrival_times(len(runs), rate, opts.arrival, opts.cv, opts.seed)
        out[rate] = [Job(job, run, t, ex) for job, run, t, ex in zip(ids, drawn, times, examples)]
    return out


@dataclass(frozen=True)
class Step:
    """One run of the plan."""

    repeat: int
    fold: int
    spec: PolicySpec
    rate: float


def grouped(specs: Sequence[PolicySpec], engines: Callable[[PolicySpec], list[EngineConfig]]
            ) -> list[list[PolicySpec]]:
    """Specs grouped by engine settings (groups in order of first appearance)."""
    groups: list[tuple[list[EngineConfig], list[PolicySpec]]] = []
    for s in specs:
        e = engines(s)
        for key, members in groups:
            if key == e:
                members.append(s)
                break
        else:
            groups.append((e, [s]))
    return [members for _, members in groups]


def schedule(specs: Sequence[PolicySpec], rates: Sequence[float], repeats: int,
             engines: Callable[[PolicySpec], list[EngineConfig]], folds: int = 1
             ) -> list[Step]:
    """The runs in order: repeat after repeat; in repeat k the engine groups are rotated by
    k, and within a group fold after fold, the group's specs rotated by k + fold, so that
    no policy always runs first, or first after an engine restart."""
    groups = grouped(specs, engines)
    return [Step(k, f, s, r) for k in range(repeats) for g in _rotated(groups, k)
            for f in range(folds) for s in _rotated(g, k + f) for r in rates]


MIN_REPEATS_ACROSS_GROUPS = 3
"""Repeats below which a live comparison across engine groups gets ``drift_warning``."""


def drift_warning(groups: Sequence[Sequence[PolicySpec]], repeats: int) -> str | None:
    """A warning when specs on different engine settings are compared live with fewer than
    ``MIN_REPEATS_ACROSS_GROUPS`` repeats: each group runs on its own engine start, one
    after the other, and drift between them (the machine, the engines' state) lies between
    the groups, where intervals over workflows cannot see it and those over so few repeats
    barely can."""
    if len(groups) < 2 or repeats >= MIN_REPEATS_ACROSS_GROUPS:
        return None
    names = " | ".join(", ".join(s.label for s in g) for g in groups)
    return (f"warning: {len(groups)} engine groups ({names}) run one after the other with "
            f"--repeats {repeats}: a difference between groups may be drift between their "
            f"engine starts, not the specs; give --repeats {MIN_REPEATS_ACROSS_GROUPS} or "
            "more (the groups rotate every repeat)")


def _rotated(items: Sequence[Any], k: int) -> list[Any]:
    k %= len(items)
    return [*items[k:], *items[:k]]


@dataclass(frozen=True)
class Fold:
    """What the runs of one fold share (one fold without cross-fitting)."""

    routers: dict[str, RouterConfig]
    """Per policy label, its router's settings (the fold's predictors and priors)."""
    jobs: dict[float, list[Job]]
    """Per rate, the workload (problems the fold's predictors held out)."""
    splits: list[Split]
    """The splits of the predictors its routers load."""
    priors: dict[str, dict[str, float]] | None
    """The static priors filled from the fold's training problems (``--priors-from-trace``)."""


@dataclass(frozen=True)
class Prepared:
    """What every run of a replay (live or twin) shares, checked before any run."""

    model_map: dict[str, str]
    """Served model -> trace model."""
    folds: list[Fold]
    engines: dict[str, list[EngineConfig]]
    """Per policy label, its engines."""
    plan: list[Step]
    """The runs in order."""
    summary: dict[str, Any]
    """``meta`` filled, ``runs`` empty."""


def prepare_fold(cfg: ClusterConfig, trace: Trace, opts: ReplayOptions,
                 model_map: dict[str, str], artifacts: Mapping[str, str], first: int
                 ) -> Fold:
    """The routers (priors, ``artifacts``) of every policy, checked, and the workload of the
    problems the artifacts held out, job ids from ``first``."""
    routers = {s.label: router_variant(cfg, s, None, artifacts) for s in opts.policies}
    splits = trained_splits(routers.values())
    priors = None
    if opts.priors_from_trace:
        priors = trace_priors(prior_runs(trace, list(model_map.values()), splits), model_map)
        routers = {s.label: router_variant(cfg, s, priors, artifacts) for s in opts.policies}
    for s in opts.policies:
        check_variant(cfg, routers[s.label], s)
    jobs = make_jobs(trace, list(model_map.values()), opts, splits, first)
    check_trace_gaps(opts.tool_gaps, [j.run for js in jobs.values() for j in js], model_map)
    return Fold(routers, jobs, splits, priors)


def prepare(cfg: ClusterConfig, trace: Trace, trace_name: str, opts: ReplayOptions,
            command: str) -> Prepared:
    """Resolve the model map, the routers (priors, artifacts) and engines of every policy
    in every fold, check them, draw the workload; ValueError (SpecError, ClusterError, ...)
    on a problem."""
    model_map = resolve_model_map(served_models(cfg), opts.model_map, trace.models)
    folds = [prepare_fold(cfg, trace, opts, model_map, a, k * opts.workflows)
             for k, a in enumerate(opts.artifacts or [{}])]
    if len(folds) > 1:
        check_folds(folds, opts.problems)
    engines = {s.label: engine_variant(cfg, s.sched, s.engine_overrides)
               for s in opts.policies}
    summary: dict[str, Any] = {
        "meta": run_meta(cfg, trace, trace_name, opts, model_map,
                         folds[0].priors if len(folds) == 1 else [f.priors for f in folds],
                         command),
        "runs": []}
    summary["meta"]["problems"] = opts.problems
    summary["meta"]["folds"] = len(folds)
    summary["meta"]["held_out_splits"] = [dataclasses.asdict(s) for f in folds
                                          for s in f.splits]
    summary["meta"]["inputs"] = {label: spec_inputs(r)
                                 for label, r in folds[0].routers.items()}
    plan = schedule(opts.policies, opts.rates, opts.repeats, lambda s: engines[s.label],
                    len(folds))
    return Prepared(model_map, folds, engines, plan, summary)


def check_folds(folds: Sequence[Fold], problems: str) -> None:
    """ValueError unless cross-fitted folds can be pooled: held-out problems only, and every
    fold routes on predictors of its own split."""
    if problems != "held-out":
        raise ValueError(f"--problems {problems}: cross-fitted artifacts replay held-out "
                         "problems; to tune on trained problems pass one fold's folder "
                         "(e.g. artifacts/fold-0)")
    splits = [tuple(f.splits) for f in folds]
    if not all(splits):
        raise ValueError("cross-fitted artifacts, but no policy routes on trained "
                         "predictors: drop --artifacts or add such a policy")
    if len(set(splits)) < len(splits):
        raise ValueError("two artifact folds have the same split: every fold must hold out "
                         "its own problems (python -m kernels_bench artifacts --folds K)")


def replay(cfg: LaunchConfig, trace: Trace, trace_name: str, opts: ReplayOptions,
           command: str) -> dict[str, Any]:
    """Run every policy at every rate; write outputs after each run; return the summary."""
    p = prepare(cfg, trace, trace_name, opts, command)
    summary = p.summary
    warning = drift_warning(grouped(opts.policies, lambda s: p.engines[s.label]), opts.repeats)
    if warning:
        tqdm.write(warning)
        summary["meta"]["warnings"] = [warning]
    opts.out.mkdir(parents=True, exist_ok=True)
    cluster = BenchCluster(cfg, opts.run_dir, tqdm.write)
    try:
        for i, step in enumerate(p.plan, 1):
            spec, rate, repeat, fold = step.spec, step.rate, step.repeat, p.folds[step.fold]
            desc = (f"[{i}/{len(p.plan)}] {spec.label} @ {rate:g}/s"
                    + run_tag(repeat, step.fold, opts))
            for attempt in range(1, opts.run_attempts + 1):
                cluster.prepare(p.engines[spec.label])
                url = cluster.start_router(fold.routers[spec.label], desc)
                cluster.reset_prefix_caches()
                run = _one_run(cluster, url, fold.jobs[rate], spec, p.model_map, opts, desc)
                cluster.stop_router()
                cluster.check_engines()
                if not run["summary"]["engine_down_events"] or attempt == opts.run_attempts:
                    break
                tqdm.write(f"{desc}: the router marked an engine down during the run; "
                           f"running it again ({attempt + 1} of {opts.run_attempts})")
            run.update(policy=spec.label, router=spec.router, sched=spec.sched,
                       oracle=spec.oracle, rate=rate, repeat=repeat, fold=step.fold,
                       run_attempts=attempt)
            summary["runs"].append({k: v for k, v in run.items()
                                    if k not in ("requests", "workflows")})
            write_run(opts.out, run)
            write_summary(opts.out, summary)
            tqdm.write(one_line(run))
    finally:
        cluster.close()
    return summary


def run_tag(repeat: int, fold: int, opts: ReplayOptions) -> str:
    """`` (repeat r, fold f)`` as far as there are several."""
    parts = ([f"repeat {repeat + 1}"] if opts.repeats > 1 else []) + (
        [f"fold {fold}"] if len(opts.artifacts) > 1 else [])
    return f" ({', '.join(parts)})" if parts else ""


def _one_run(cluster: BenchCluster, url: str, jobs: list[Job], spec: PolicySpec,
             model_map: dict[str, str], opts: ReplayOptions, desc: str) -> dict[str, Any]:
    instances = cluster.instances()
    before = {i.name: em.scrape(cluster.http, i.url) for i in instances}
    downs_before = em.router_down_events(cluster.http, url)
    decisions_before, cpu_before = em.router_decisions(cluster.http, url), cluster.router_cpu_s()
    settings = client_settings(opts, spec, model_map)

    async def go() -> AgenticClient:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                     limits=limits) as http:
            clock = run_clock()
            client = AgenticClient(settings,
                                   http_sender(http, f"{url}/v1/chat/completions", clock),
                                   clock)
            posts: set[asyncio.Task[Any]] = set()
            if spec.router == "online":  # the agent reports each attempt's check
                client.on_outcome = outcome_poster(http, f"{url}/v1/hetserve/outcomes", posts)
            with tqdm(total=len(jobs), desc=desc, unit="wf", leave=False) as bar:
                await client.run(jobs, bar)
            await asyncio.gather(*posts)
        return client

    client = asyncio.run(go())
    after = {i.name: em.scrape(cluster.http, i.url) for i in instances}
    per_engine = {n: after[n] - before[n] for n in before}
    summary = summarize(client.requests, client.workflows, em.total(per_engine.values()))
    summary["engine_down_events"] = int(em.router_down_events(cluster.http, url) - downs_before)
    decisions = em.router_decisions(cluster.http, url) - decisions_before
    summary["router"] = {"cpu_s": cluster.router_cpu_s() - cpu_before,
                         **decisions.summary()}
    return {
        "summary": summary,
        "engines": {n: dataclasses.asdict(c) for n, c in per_engine.items()},
        "block_sizes": {i.name: em.block_size(em.cache_config(cluster.http, i.url))
                        for i in instances},
        "requests": client.requests,
        "workflows": client.workflows,
    }


def one_line(run: dict[str, Any]) -> str:
    """A finished run in one line: E2E, queueing, score, errors."""
    s = run["summary"]
    e2e, q = s["e2e_s"], s["queue_s"]
    parts = [f"{run['policy']} @ {run['rate']:g}/s:",
             f"E2E mean {_fmt(e2e['mean'])} s p95 {_fmt(e2e['p95'])} s",
             f"queue {_fmt(q['mean'])} s", f"score {_fmt(s['score'])}",
             f"errors {s['errors']}"]
    if s["engine_down_events"]:
        parts.append(f"warning: the router marked an engine down {s['engine_down_events']} "
                     "time(s) during this run (see the router logs)")
    return "  ".join(parts)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def run_meta(cfg: ClusterConfig, trace: Trace, trace_name: str, opts: ReplayOptions,
          model_map: dict[str, str], priors: Any, command: str) -> dict[str, Any]:
    """What the run was (file names only, never a path of this machine); ``priors``: the
    static priors filled from the trace, or None (cross-fitted: a list, one per fold)."""
    return {
        "command": command,
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "cluster": Path(cfg.source).name,
        "trace": trace_name,
        "suite": trace.header.suite,
        "model_map": model_map,
        "engines": [{"name": e.name, "model": _model_name(e), "served": e.served_model_name,
                     "replicas": e.replicas,
                     "sched_policy": e.sched_policy if isinstance(e, LocalEngine) else None,
                     "max_num_seqs": e.max_num_seqs, "max_model_len": e.max_model_len}
                    for e in cfg.engines],
        "policies": [dataclasses.asdict(s) for s in opts.policies],
        "rates": opts.rates, "arrival": opts.arrival,
        "cv": opts.cv if opts.arrival == "gamma" else 1.0,
        "workflows": opts.workflows, "seed": opts.seed, "max_attempts": opts.max_attempts,
        "retry_on": opts.retry_on,
        "tool_gap": opts.tool_gaps.label(), "context": opts.context,
        "repeats": opts.repeats,
        "run_attempts": opts.run_attempts,
        "baseline": opts.baseline, "priors_from_trace": priors,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine()},
    }


def _model_name(e: EngineConfig) -> str:
    """The engine's model as results show it: a local folder by its name only."""
    if e.model is None:
        return e.url if isinstance(e, RemoteEngine) else ""
    return Path(e.model).name if os.path.isabs(e.model) else e.model
