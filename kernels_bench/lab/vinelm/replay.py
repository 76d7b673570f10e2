"""``python -m kernels_bench replay-vinelm``: VineLM served live under load, with and
without re-rooting, against the best static assignment, on recorded real executions.

Workload: the problems whose every trie node is recorded in an executions file
(``python -m kernels_bench vinelm collect``: real runs of the real models). The replay cluster's
engines stand in for those models (``--model-map served=recorded``). A workflow is one
program of the template. At each call the client sends the stage's recorded messages
after the realised prefix, ``per_model.max_tokens`` = each model's recorded output length
at this node (``ignore_eos``: the engine does the real amount of work) and the objective
(maximise accuracy within the latency SLO). The router picks the model; the client
follows the realised prefix in the records: a right answer ends the workflow, else the
next call runs, up to the longest run.

The trie: cascade profiling over the recorded executions of every problem, with each
invocation's latency in the replay cluster's units, ``a[m] + b[m] x recorded output
tokens``, where a and b are measured on the idle cluster before the runs (calibration),
and cost at the template's prices. The trie is in-sample for the replayed problems; the
variants share it, so they differ only in control:

- ``vinelm``: re-rooted at every call on the realised prefix and elapsed time, load-aware;
- ``vinelm-noreroot``: the plan of the program's first call is followed (``reroot = false``);
- ``static``: the best static assignment (one model per logical stage) the same trie
  gives for the SLO, sent by model name.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx
from tqdm import tqdm

from kernels_bench.lab.replay.arrivals import arrival_times
from kernels_bench.lab.replay.client import http_sender, run_clock
from kernels_bench.lab.replay.spec import SpecError
from kernels_bench.lab.vinelm.executions import Execution, RecordedExecutor, read_executions
from kernels_bench.lab.vinelm.executors import Prices
from kernels_bench.lab.vinelm.experiment import slo_targets, static_assignments, static_path
from kernels_bench.lib.cluster import ClusterError, BenchCluster, engine_variant
from kernels_bench.lib.model_map import parse_model_map
from launcher.settings import load_launch_config
from router.config.cluster import load_cluster_config
from router.vinelm.estimate import EstimationSettings, annotate
from router.vinelm.objective import Objective
from router.vinelm.profiling import Outcome, cascade_sample
from router.vinelm.template import WorkflowTemplate, parse_template
from router.vinelm.trie import Path_, Trie, save_tries

VARIANTS = ("vinelm", "vinelm-noreroot", "static")
CALIBRATION_TOKENS = (16, 128)


@dataclass(frozen=True)
class Latency:
    """Idle latency of one call on a served model: a + b x output tokens (seconds)."""

    a: float
    b: float

    def of(self, output_tokens: int) -> float:
        return self.a + self.b * output_tokens


@dataclass
class Served:
    """Recorded executions seen through served model names, latencies calibrated."""

    recorded: RecordedExecutor
    to_recorded: Mapping[str, str]
    latency: Mapping[str, Latency]

    def node(self, problem: str, prefix: Path_) -> Execution:
        return self.recorded.table[problem, tuple(self.to_recorded[m] for m in prefix)]

    def run(self, problem: str, prefix: Path_) -> Outcome:
        out = self.recorded.run(problem, tuple(self.to_recorded[m] for m in prefix))
        tokens = self.node(problem, prefix).stage.output_tokens
        return Outcome(out.success, out.cost, self.latency[prefix[-1]].of(tokens))


def served_template(t: WorkflowTemplate, to_served: Mapping[str, str]) -> WorkflowTemplate:
    """``t`` with its models renamed to served names."""
    stages = tuple(dataclasses.replace(s, models=tuple(to_served[m] for m in s.models))
                   for s in t.stages)
    return dataclasses.replace(t, stages=stages)


def best_static(template: WorkflowTemplate, trie: Trie, obj: Objective) -> Path_:
    """The static assignment (one model per logical stage) the trie rates best for a
    ``max_accuracy`` objective: the most accurate that fits its budgets (ties: cheaper,
    then faster); when none fits, the fastest."""
    paths = [static_path(template, a) for a in static_assignments(template)]
    fits = [p for p in paths
            if (obj.max_latency_s is None or trie[p].latency_s <= obj.max_latency_s)
            and (obj.max_cost is None or trie[p].cost <= obj.max_cost)]
    if fits:
        return min(fits, key=lambda p: (-trie[p].accuracy, trie[p].cost, trie[p].latency_s, p))
    return min(paths, key=lambda p: (trie[p].latency_s, p))


@dataclass
class WorkflowResult:
    variant: str
    slo_s: float
    job: str
    problem: str
    arrival_s: float
    end_s: float = 0.0
    success: bool = False
    cost: float = 0.0
    models: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def latency_s(self) -> float:
        return self.end_s - self.arrival_s


async def run_workflow(send: Any, served: Served, template: WorkflowTemplate,
                       job: str, problem: str, arrival_s: float, variant: str, slo_s: float,
                       static: Path_ | None) -> WorkflowResult:
    """One program: calls until a right answer or the longest run; ``static``: the models
    to name (no objective), else ``model = auto`` with the objective."""
    res = WorkflowResult(variant, slo_s, job, problem, arrival_s)
    invs = template.invocations()
    prefix: Path_ = ()
    for depth, inv in enumerate(invs):
        children = {m: served.node(problem, prefix + (m,)) for m in inv.models}
        first = next(iter(children.values()))
        lengths = {m: max(1, e.stage.output_tokens) for m, e in children.items()}
        body: dict[str, Any] = {
            "model": static[depth] if static else "auto",
            "messages": [{"role": m.role, "content": m.content} for m in first.stage.messages],
            "max_tokens": max(lengths.values()), "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
            "per_model": {"max_tokens": lengths},
            "workflow": {"program_id": f"{variant}/{job}", "workflow": template.name,
                         "stage": inv.stage, "stage_index": depth}}
        if static is None:
            body["workflow"]["objective"] = {"kind": "max_accuracy", "max_latency_s": slo_s}
        r = await send(body)
        res.end_s = r.end_s
        if r.error is not None or r.model not in children:
            res.error = r.error or f"the router chose {r.model!r}, not one of {list(children)}"
            return res
        prefix = prefix + (r.model,)
        res.models.append(r.model)
        out = served.run(problem, prefix)
        res.cost += out.cost
        if out.success:
            res.success = True
            break
    return res


def calibrate(cluster: BenchCluster, messages: list[dict[str, str]]) -> dict[str, Latency]:
    """Idle latency per served model from two forced lengths (best of two calls each)."""
    out = {}
    for inst in {i.served_model_name: i for i in cluster.instances()}.values():
        times = []
        for n in CALIBRATION_TOKENS:
            best = float("inf")
            for _ in range(2):
                t0 = time.perf_counter()
                r = cluster.http.post(f"{inst.url}/v1/chat/completions", timeout=600.0, json={
                    "model": inst.served_model_name, "messages": messages, "max_tokens": n,
                    "ignore_eos": True, "temperature": 0.0})
                if r.status_code != 200:
                    raise ClusterError(f"calibration call to {inst.name}: HTTP "
                                       f"{r.status_code} {r.text[:300]}")
                best = min(best, time.perf_counter() - t0)
            times.append(best)
        (n0, n1), (t0_, t1) = CALIBRATION_TOKENS, times
        b = max(0.0, (t1 - t0_) / (n1 - n0))
        out[inst.served_model_name] = Latency(max(0.0, t0_ - b * n0), b)
    return out


def summarize(results: Sequence[WorkflowResult]) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    lat = sorted(r.latency_s for r in ok)

    def pct(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

    calls: dict[str, int] = {}
    for r in ok:
        for m in r.models:
            calls[m] = calls.get(m, 0) + 1
    n = max(1, len(ok))
    return {"workflows": len(results), "errors": len(results) - len(ok),
            "accuracy": sum(r.success for r in ok) / n,
            "slo_violations": sum(r.latency_s > r.slo_s for r in ok) / n,
            "mean_latency_s": sum(lat) / n if lat else None, "p50_latency_s": pct(0.5),
            "p95_latency_s": pct(0.95), "mean_cost": sum(r.cost for r in ok) / n,
            "calls_per_model": calls}


def profile_trie(served: Served, template: WorkflowTemplate, problems: Sequence[str],
                 vs: Mapping[str, Any], cascades: int, seed: int, out: Path) -> Trie:
    """Cascade-profile ``template`` (served names) over ``problems`` with the VineLM
    table's estimation settings; write the profile file the router loads."""
    est = EstimationSettings(vs.get("smooth_rank", 1), vs.get("smooth_depths", 1),
                             vs.get("smooth_strength", 5.0))
    obs = cascade_sample(served, template.invocations(), problems, cascades, seed)
    trie = annotate(template.name, template.invocations(), obs, est)
    save_tries(out, {template.name: trie.to_json(template, {
        "source": "replay-vinelm calibration", "executions": obs.executions})})
    return trie


def served_settings(vs: Mapping[str, Any], workflow: str, to_served: Mapping[str, str],
                    profile: Path) -> dict[str, Any]:
    """The router's VineLM template, prices and profile for the served models."""
    raw = vs["workflows"][workflow]
    return {"workflows": {workflow: {**raw, "stages": [
                {**st, "models": [to_served[m] for m in st["models"]]}
                for st in raw["stages"]]}},
            "profile_path": str(profile),
            **{key: {to_served[m]: v for m, v in vs[key].items() if m in to_served}
               for key in ("prompt_cost_per_1k", "output_cost_per_1k")}}


def replay_vinelm(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_launch_config(args.cluster)
    header, table = read_executions(args.executions)
    qcfg = load_cluster_config(args.vinelm_config)
    vs = qcfg.router.policies.get("vinelm", {})
    if header.workflow not in vs.get("workflows", {}):
        raise SpecError(f"{args.vinelm_config}: no VineLM template {header.workflow!r}")
    template = parse_template(header.workflow, vs["workflows"][header.workflow])
    if template.signature() != header.signature:
        raise SpecError(f"{args.executions} was collected for {header.signature}, the "
                        f"template is {template.signature()}")
    to_recorded = parse_model_map(args.model_map)
    served_names = {e.served_model_name for e in cfg.engines}
    bad = sorted(set(to_recorded) - served_names) + sorted(
        set(template.models()) - set(to_recorded.values()))
    if bad or len(set(to_recorded.values())) != len(to_recorded):
        raise SpecError(f"--model-map must map served models ({', '.join(sorted(served_names))})"
                        f" one-to-one onto the template's ({', '.join(template.models())})")
    to_served = {v: k for k, v in to_recorded.items()}
    prices = Prices(vs.get("prompt_cost_per_1k", {}), vs.get("output_cost_per_1k", {}))
    prices.check(template.models())
    recorded = RecordedExecutor(table, prices)
    invs = template.invocations()
    problems = [p for p in recorded.problems() if recorded.complete(p, invs)]
    if not problems:
        raise SpecError(f"{args.executions}: no problem has every node recorded")
    stemplate = served_template(template, to_served)
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = BenchCluster(cfg, args.out / "cluster", tqdm.write)
    report: dict[str, Any] = {"command": args.command, "executions": args.executions.name,
                              "cluster": args.cluster.name, "model_map": to_recorded,
                              "problems": len(problems), "rate": args.rate,
                              "workflows": args.workflows, "runs": []}
    try:
        cluster.prepare(engine_variant(cfg, None))
        # a node at depth 2 (a prompt with history), on each stage's first model
        any_node = table[problems[0], tuple(inv.models[0] for inv in invs[:2])]
        latency = calibrate(cluster, [{"role": m.role, "content": m.content}
                                      for m in any_node.stage.messages])
        report["calibration"] = {m: dataclasses.asdict(v) for m, v in latency.items()}
        tqdm.write("calibration (idle s = a + b x tokens): " + ", ".join(
            f"{m}: {v.a:.3f} + {v.b * 1000:.2f} ms" for m, v in latency.items()))
        served = Served(recorded, to_recorded, latency)
        profile = (args.out / "profile.json").absolute()
        trie = profile_trie(served, stemplate, problems, vs, args.cascades, args.seed, profile)
        slos = args.slos or slo_targets(trie)
        rng = random.Random(args.seed)
        picks = [rng.choice(problems) for _ in range(args.workflows)]
        times = arrival_times(args.workflows, args.rate, "poisson", 1.0, args.seed)
        base_tables = {k: dict(v) for k, v in cfg.router.policies.items()}
        for slo in slos:
            for variant in args.variants:
                static = (best_static(stemplate, trie, Objective("max_accuracy",
                                                                 max_latency_s=slo))
                          if variant == "static" else None)
                tables = {**base_tables, "vinelm": {
                    **base_tables.get("vinelm", {}),
                    **served_settings(vs, template.name, to_served, profile),
                    "reroot": variant != "vinelm-noreroot"}}
                router = dataclasses.replace(cfg.router, policy="vinelm", policies=tables)
                desc = f"{variant} @ SLO {slo:.1f} s"
                url = cluster.start_router(router, desc)
                cluster.reset_prefix_caches()
                results = asyncio.run(_run(url, served, stemplate, picks, times, variant, slo,
                                           static, desc))
                cluster.stop_router()
                cluster.check_engines()
                summary = summarize(results)
                report["runs"].append({"variant": variant, "slo_s": slo,
                                       "static_path": list(static) if static else None,
                                       **summary})
                _write(args.out, report, results)
                tqdm.write(f"{desc}: accuracy {summary['accuracy']:.3f}, SLO violations "
                           f"{summary['slo_violations']:.3f}, p95 "
                           f"{summary['p95_latency_s'] or 0:.1f} s, errors {summary['errors']}")
    finally:
        cluster.close()
    return report


async def _run(url: str, served: Served, template: WorkflowTemplate, picks: list[str],
               times: list[float], variant: str, slo: float, static: Path_ | None,
               desc: str) -> list[WorkflowResult]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                 limits=limits) as http:
        clock = run_clock()
        send = http_sender(http, f"{url}/v1/chat/completions", clock)
        with tqdm(total=len(picks), desc=desc, unit="wf", leave=False) as bar:
            async def one(i: int, problem: str, at: float) -> WorkflowResult:
                await asyncio.sleep(max(0.0, at - clock()))
                r = await run_workflow(send, served, template, f"w{i:04d}", problem,
                                       at, variant, slo, static)
                bar.update()
                return r
            return list(await asyncio.gather(*(one(i, p, t) for i, (p, t)
                                               in enumerate(zip(picks, times)))))


def _write(out: Path, report: Mapping[str, Any], results: Sequence[WorkflowResult]) -> None:
    (out / "summary.json").write_text(json.dumps(report, indent=1) + "\n")
    with (out / "workflows.jsonl").open("a") as f:
        for r in results:
            f.write(json.dumps({**dataclasses.asdict(r), "latency_s": r.latency_s}) + "\n")
    (out / "summary.md").write_text(markdown(report))
    plot(report, out / "summary.png")


def plot(report: Mapping[str, Any], path: Path) -> None:
    """SLO violations and accuracy per variant, grouped by SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    slos = sorted({r["slo_s"] for r in runs})
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        by = {r["slo_s"]: r for r in runs if r["variant"] == v}
        xs = [j + i * width for j, slo in enumerate(slos) if slo in by]
        for ax, key in zip(axes, ("slo_violations", "accuracy")):
            ax.bar(xs, [by[slo][key] for slo in slos if slo in by], width, label=v)
    for ax, title in zip(axes, ("share of workflows over the SLO", "accuracy")):
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(slos))])
        ax.set_xticklabels([f"SLO {s:.0f} s" for s in slos])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"VineLM served live: {report['executions']}, {report['workflows']} "
                 f"workflows at {report['rate']:g}/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(report: Mapping[str, Any]) -> str:
    lines = ["| SLO (s) | variant | accuracy | SLO violations | mean E2E (s) | p95 E2E (s) "
             "| mean cost | calls per model | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        calls = ", ".join(f"{m} {n}" for m, n in sorted(r["calls_per_model"].items()))
        lines.append(f"| {r['slo_s']:.1f} | {r['variant']} | {r['accuracy']:.3f} | "
                     f"{r['slo_violations']:.3f} | {r['mean_latency_s'] or 0:.1f} | "
                     f"{r['p95_latency_s'] or 0:.1f} | {r['mean_cost']:.4f} | {calls} | "
                     f"{r['errors']} |")
    return "\n".join(lines) + "\n"
