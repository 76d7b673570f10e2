"""A twin replay: the serving replay's runs on engine twins and the real router, on a
virtual clock, in parallel processes.

Everything a live replay decides before its first run comes from the same function
(``kernels_bench.lab.replay.run.prepare``: model map, router settings, priors, engines,
workload, run plan); every run builds a fresh cluster of engine twins
(``engine_spec.engine_specs`` of the run's engines, each with its entry's profile) and a
fresh ``TwinRouter``, and replays the jobs with the replay's own ``AgenticClient`` on the
virtual loop. Records, summary, intervals and plots are the live replay's
(``replay.output``), so ``kernels_bench results`` reads a twin's folder as a live one's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from kernels_bench.lab.replay.client import AgenticClient, ClientSettings
from kernels_bench.lab.replay.metrics import summarize
from kernels_bench.lab.replay.output import write_run, write_summary
from kernels_bench.lab.replay.run import ReplayOptions, client_settings, one_line, prepare, run_tag
from kernels_bench.lab.replay.spec import PolicySpec
from kernels_bench.lab.replay.workload import Job
from kernels_bench.lab.twin.engine import EngineTwin
from kernels_bench.lab.twin.engine_spec import engine_specs
from kernels_bench.lab.twin.loop import VirtualLoop
from kernels_bench.lab.twin.router import DEFAULT_SCRAPE_INTERVAL_S, RouterCosts, TwinRouter
from kernels_bench.lab.twin.sim import Simulator
from kernels_bench.lab.twin.step_time import EngineProfile, StepTimeModel, load_profile
from kernels_bench.lib.engine_metrics import Decisions, EngineCounters
from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import EngineConfig, LocalEngine
from router.predictors.base import PredictorSet
from router.trace_format import Trace


@dataclass(frozen=True)
class TwinOptions:
    """What a twin run adds to the replay's options."""

    profiles: Mapping[str, EngineProfile]
    """Engine entry name -> its profile (``kernels_bench profile``, or modelled)."""
    costs: RouterCosts = dataclasses.field(default_factory=RouterCosts)
    slowdown: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Engine entry name -> K of ``StepTimeModel.step_ms`` (absent: 1)."""
    jitter: bool = False
    """Step times drawn around the profile's median with its measured spread (repeat k
    draws with seed k); off: the median."""
    jobs: int = 1
    """Runs simulated at once, one process each."""
    stock: bool = False
    """Engines on one of vLLM's own policies (``router.config.engines.STOCK_SCHED_POLICIES``)
    are stock vLLM servers, which the router scrapes; off: every engine is hetserve's."""
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    """Between two scrapes of a stock engine's ``/metrics`` (virtual seconds)."""


@dataclass(frozen=True)
class RunTask:
    """One run of the plan, as a worker process gets it."""

    cfg: ClusterConfig
    """The run's cluster: its engines and router settings."""
    spec: PolicySpec
    repeat: int
    fold: int
    rate: float
    jobs: list[Job]
    client: ClientSettings
    twin: TwinOptions


FIRST_PORT = 20_000
"""Ports the twin writes into engines the file leaves to the launcher: the router's
config needs a URL per instance; the twin never opens one."""


def run_config(cfg: ClusterConfig, engines: list[EngineConfig],
               router: RouterConfig) -> ClusterConfig:
    """The cluster of one policy's runs: its engines (ports and telemetry endpoints the
    launcher would assign filled with addresses nothing opens), its router."""
    port, filled = FIRST_PORT, []
    for e in engines:
        if isinstance(e, LocalEngine) and e.port is None:
            e = dataclasses.replace(e, port=port)
            port += e.replicas
        filled.append(dataclasses.replace(
            e, telemetry_endpoint=e.telemetry_endpoint or f"ipc://twin-{e.name}-telemetry",
            kv_events_endpoint=e.kv_events_endpoint or f"ipc://twin-{e.name}-kv"))
    return dataclasses.replace(cfg, engines=filled, router=router)


_PREDICTORS: dict[tuple[tuple[str, str], ...], PredictorSet | None] = {}
"""Predictors loaded in this process, by the folders they come from."""


def predictors_of(cfg: ClusterConfig) -> PredictorSet | None:
    """The run's predictors, in-process (the twin has no predictor service), loaded once
    per process."""
    key = tuple(sorted(cfg.router.predictors.items()))
    if key not in _PREDICTORS:
        from router.predictors.loader import load_cluster_predictors

        _PREDICTORS[key] = load_cluster_predictors(cfg, service=None)
    return _PREDICTORS[key]


def engine_counters(engines: Sequence[EngineTwin]) -> EngineCounters:
    """What the live replay reads from vLLM's counters, from the twins' records: prefix
    cache queries and hits (prompt tokens, cached ones), queue time (engine arrival to
    first scheduling), preemptions, prompt and generated tokens."""
    c = EngineCounters()
    for e in engines:
        c.preemptions += e.preemptions
        for r in e.records.values():
            c.prefix_queries += r.prompt_tokens
            c.prefix_hits += r.cached_tokens
            c.prompt_tokens += r.prompt_tokens
            c.generation_tokens += r.generated
            if r.queue_s is not None:
                c.queue_sum_s += r.queue_s
                c.queue_count += 1
    return c


def retention_counters(engines: Sequence[EngineTwin]) -> dict[str, Any]:
    """What KV retention and program-aware admission did, summed over the engines: the
    programs released by reason, the calls not protected, the calls admitted first."""
    released: Counter[str] = Counter()
    refused = admitted_first = 0
    for e in engines:
        retention = getattr(e.scheduler, "retention", None)
        if retention is not None:
            released.update(retention.released)
            refused += retention.refused
        admitted_first += getattr(e.scheduler, "admitted_first", 0)
    return {"released": dict(sorted(released.items())), "refused": refused,
            "admitted_first": admitted_first}


def simulate(task: RunTask) -> dict[str, Any]:
    """One run on a fresh twin cluster; the run's record as the live replay writes it."""
    wall0 = time.perf_counter()
    sim = Simulator()
    for i, spec in enumerate(engine_specs(task.cfg, task.twin.stock)):
        sim.add_engine(spec, StepTimeModel(task.twin.profiles[spec.entry], task.twin.jitter,
                                           seed=task.repeat * 10_000 + i,
                                           slowdown=task.twin.slowdown.get(spec.entry, 1.0)),
                       telemetry=True)
    loop = VirtualLoop(sim)
    try:
        router = TwinRouter(task.cfg, loop, predictors_of(task.cfg), task.twin.costs,
                            scrape_interval_s=task.twin.scrape_interval_s)
        client = AgenticClient(task.client, router.send, loop.time)
        client.on_outcome = outcome_reporter(router)

        async def go() -> None:
            await router.start()
            await client.run(task.jobs)
            await router.stop()

        loop.run_until_complete(go())
    finally:
        loop.close()
    engines = list(sim.engines.values())
    summary = summarize(client.requests, client.workflows, engine_counters(engines))
    summary["engine_down_events"] = router.core.membership.stats.engine_down_events
    spent = router.decision_s
    summary["router"] = {"cpu_s": sum(spent), **Decisions.of(spent).summary()}
    wall = time.perf_counter() - wall0
    summary["twin"] = {"virtual_s": sim.now(), "wall_s": wall,
                       "engine_steps": sum(e.steps for e in engines),
                       "busy": (sum(e.busy_s for e in engines) / len(engines) / sim.now()
                                if sim.now() else None),
                       "virtual_s_per_wall_s": sim.now() / wall if wall else None,
                       "retention": retention_counters(engines)}
    return {
        "summary": summary,
        "engines": {e.name: dataclasses.asdict(engine_counters([e])) for e in engines},
        "block_sizes": {e.name: e.spec.block_size for e in engines},
        "requests": client.requests,
        "workflows": client.workflows,
    }


def outcome_reporter(router: TwinRouter) -> Callable[[str, bool], None]:
    """Where the policy learns from outcomes (``online``: its ``book``), what the agent's
    ``POST /v1/hetserve/outcomes`` would do: the program's outcome credited when its
    attempt ends (delayed feedback); nothing for the other policies."""
    def report(program_id: str, correct: bool) -> None:
        book = getattr(router.core.routing.policy, "book", None)
        if book is not None:
            book.report(program_id, None, float(correct))
    return report


def twin(cfg: ClusterConfig, trace: Trace, trace_name: str, opts: ReplayOptions,
         topts: TwinOptions, command: str) -> dict[str, Any]:
    """Every policy at every rate on the twin; outputs written after each run (in plan
    order); the summary."""
    remote = [e.name for e in cfg.engines if e.remote]
    if remote:
        raise ValueError(f"engines {', '.join(remote)} are remote (url): the twin simulates "
                         "engines the cluster file describes (model, sizes), not remote ones")
    p = prepare(cfg, trace, trace_name, opts, command)
    missing = sorted({e.name for e in cfg.engines} - set(topts.profiles))
    if missing:
        raise ValueError(f"no profile for engine(s) {', '.join(missing)}: give --profiles DIR "
                         "with <engine>.json (python -m kernels_bench profile, or "
                         "python -m kernels_bench.lab.twin.roofline)")
    p.summary["meta"]["twin"] = {
        "profiles": {k: v.modelled or "measured" for k, v in topts.profiles.items()},
        "charge_decision": topts.costs.charge_decision,
        "request_overhead_ms": topts.costs.request_overhead_s * 1e3,
        "slowdown": dict(topts.slowdown), "jitter": topts.jitter, "stock": topts.stock,
        "scrape_interval_ms": topts.scrape_interval_s * 1e3 if topts.stock else None}
    tasks = [RunTask(run_config(cfg, p.engines[s.spec.label],
                                p.folds[s.fold].routers[s.spec.label]),
                     s.spec, s.repeat, s.fold, s.rate, p.folds[s.fold].jobs[s.rate],
                     client_settings(opts, s.spec, p.model_map), topts)
             for s in p.plan]
    opts.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        results: Iterable[dict[str, Any]] = map(simulate, tasks)
        if topts.jobs > 1:
            pool = stack.enter_context(ProcessPoolExecutor(
                topts.jobs, mp_context=multiprocessing.get_context("spawn")))
            results = pool.map(simulate, tasks)
        bar = stack.enter_context(tqdm(total=len(tasks), desc="twin runs", unit="run"))
        for i, (task, run) in enumerate(zip(tasks, results), 1):
            run.update(policy=task.spec.label, router=task.spec.router, sched=task.spec.sched,
                       oracle=task.spec.oracle, rate=task.rate, repeat=task.repeat,
                       fold=task.fold, run_attempts=1)
            p.summary["runs"].append({k: v for k, v in run.items()
                                      if k not in ("requests", "workflows")})
            write_run(opts.out, run)
            write_summary(opts.out, p.summary)
            bar.update()
            tqdm.write(f"[{i}/{len(tasks)}]{run_tag(task.repeat, task.fold, opts)} "
                       f"{one_line(run)}")
    return p.summary


def load_profiles(folder: Path, entries: Sequence[str]) -> dict[str, EngineProfile]:
    """``<entry>.json`` of every engine entry in ``folder``, those that exist."""
    return {e: load_profile(folder / f"{e}.json") for e in entries
            if (folder / f"{e}.json").is_file()}
