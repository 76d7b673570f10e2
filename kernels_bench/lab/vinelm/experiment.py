"""Experiments on an environment whose exhaustive ground truth is known: the synthetic
one, or recorded real executions (``kernels_bench.lab.vinelm.collect``; then the problems are split
into folds, each fold's problems held out in turn from the profiling of the others).

1. Profiling: sparse cascade profiling against exhaustive profiling of the same
   problems: path-level accuracy error of the cascade decomposition (with and without
   smoothing) and of the naive fill-in estimate, and the profiling cost as a fraction
   of exhaustive (executions and executed cost).
2. Frontier: on held-out problems, VineLM's online control (re-rooted after every
   invocation, maximising accuracy under a cost budget; on the sparse trie, and on the
   exhaustive trie to separate control from estimation error) against the best static
   workflow-level assignment (Murakkab-style: one model per logical stage, reused by
   every loop iteration, chosen from its exhaustively profiled accuracy) at the same
   budgets. A run stops at its first success (the loop's check accepts) or at the end
   of its plan / the longest run.
3. Latency SLO under load: some invocations of the costliest model are slowed down;
   VineLM with re-rooting (realised elapsed time) against the plan made at the root.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from router.vinelm.estimate import (EstimationSettings, annotate, build_trie,
                                    conditional_estimates, decomposed_accuracy, naive_accuracy)
from router.vinelm.objective import Objective
from router.vinelm.profiling import Executor, GroundTruth, cascade_sample, exhaustive
from router.vinelm.search import search
from router.vinelm.template import Invocation, WorkflowTemplate
from router.vinelm.trie import Path_, Trie


@dataclass(frozen=True)
class ErrorStats:
    mae_leaves: float
    max_leaves: float
    mae_nodes: float


def _errors(est: Mapping[Path_, float], truth: Mapping[Path_, float], depth: int) -> ErrorStats:
    leaves = [abs(est[p] - truth[p]) for p in truth if len(p) == depth]
    nodes = [abs(est[p] - truth[p]) for p in truth]
    return ErrorStats(sum(leaves) / len(leaves), max(leaves), sum(nodes) / len(nodes))


def truth_trie(workflow: str, invocations: Sequence[Invocation], gt: GroundTruth) -> Trie:
    return build_trie(workflow, invocations, gt.accuracy, gt.step_cost, gt.step_latency_s, {})


def profiling_experiment(template: WorkflowTemplate, env: Executor, problems: list[str],
                         cascades_per_problem: int, settings: EstimationSettings,
                         seed: int, stop_at_success: bool = False,
                         progress: bool = True) -> tuple[dict[str, Any], Trie, Trie]:
    """Errors and cost fractions; returns (report, sparse trie, exhaustive trie)."""
    invs = template.invocations()
    gt = exhaustive(env, invs, problems, progress=progress, stop_at_success=stop_at_success)
    obs = cascade_sample(env, invs, problems, cascades_per_problem, seed, progress=progress)
    sparse = annotate(template.name, invs, obs, settings)
    unsmoothed = decomposed_accuracy(
        conditional_estimates(obs, invs, EstimationSettings(settings.smooth_rank, 0)), invs)

    def with_depths(d: int) -> ErrorStats:
        est = EstimationSettings(settings.smooth_rank, d, settings.smooth_strength)
        return _errors(decomposed_accuracy(conditional_estimates(obs, invs, est), invs),
                       mu_true, len(invs))

    truth = truth_trie(template.name, invs, gt)
    mu_true = {p: truth[p].accuracy for p in gt.accuracy}
    report = {
        "problems": len(problems), "cascades_per_problem": cascades_per_problem,
        "trie_nodes": len(gt.accuracy), "depth": len(invs),
        "error": {
            "decomposition_smoothed": asdict(_errors(
                {p: sparse[p].accuracy for p in mu_true}, mu_true, len(invs))),
            "decomposition_unsmoothed": asdict(_errors(unsmoothed, mu_true, len(invs))),
            "decomposition_by_smooth_depths": {str(d): asdict(with_depths(d))
                                               for d in range(len(invs) + 1)},
            "naive_fill_in": asdict(_errors(naive_accuracy(obs, invs), mu_true, len(invs))),
        },
        "cost_error_mae_leaves": sum(abs(sparse[p].cost - truth[p].cost) for p in truth.leaves())
        / len(truth.leaves()),
        "profiling": {
            "sparse_executions": obs.executions, "exhaustive_executions": gt.executions,
            "exhaustive_executions_without_checkpoints": gt.executions_without_checkpoints,
            "execution_fraction": obs.executions / gt.executions,
            "execution_fraction_vs_no_checkpoints":
                obs.executions / gt.executions_without_checkpoints,
            "cost_fraction": obs.executed_cost / gt.executed_cost,
        },
    }
    return report, sparse, truth


# ---- simulated execution


Chooser = Callable[[Path_, float], tuple[str, int]]
"""(realised prefix, elapsed) -> (next model, planned stopping depth)."""


def simulate(env: Executor, invocations: Sequence[Invocation], problem: str,
             choose: Chooser, slow: Callable[[str, Path_], float]) -> tuple[bool, float, float]:
    """One run: (success, cost, latency); ``slow`` gives each invocation's latency factor."""
    prefix: Path_ = ()
    cost = lat = 0.0
    stop = len(invocations)
    while len(prefix) < min(stop, len(invocations)):
        model, stop = choose(prefix, lat)
        prefix = prefix + (model,)
        out = env.run(problem, prefix)
        inv = invocations[len(prefix) - 1]
        cost += out.cost + inv.tool_cost
        lat += out.latency_s * slow(problem, prefix) + inv.tool_latency_s
        if out.success:
            return True, cost, lat
    return False, cost, lat


def vinelm_chooser(trie: Trie, obj: Objective, reroot: bool) -> Chooser:
    """Re-rooted control; without re-rooting, the root plan is followed to its end."""
    fixed: list[Path_] = []

    def choose(prefix: Path_, elapsed: float) -> tuple[str, int]:
        if not reroot and prefix:
            return fixed[0][len(prefix)], len(fixed[0])
        plan = search(trie, prefix, obj, elapsed)
        fixed[:] = [plan.path]
        return plan.path[len(prefix)], len(plan.path)
    return choose


def static_assignments(template: WorkflowTemplate) -> list[dict[str, str]]:
    llm = [s for s in template.stages if not s.tool]
    return [dict(zip([s.name for s in llm], combo))
            for combo in itertools.product(*[s.models for s in llm])]


def static_path(template: WorkflowTemplate, assignment: Mapping[str, str]) -> Path_:
    return tuple(assignment[inv.stage] for inv in template.invocations())


AXES = ("cost", "latency_s")
"""Frontier budgets: per-request cost (``max_cost``) or latency (``max_latency_s``)."""


def static_budgets(template: WorkflowTemplate, truth: Trie, points: int = 8,
                   axis: str = "cost") -> list[float]:
    """``points`` budgets evenly from the cheapest to the costliest static assignment
    (``axis``: cost or latency)."""
    vals = sorted(getattr(truth[static_path(template, a)], axis)
                  for a in static_assignments(template))
    return [vals[0] + (vals[-1] - vals[0]) * i / (points - 1) for i in range(points)]


def frontier_experiment(template: WorkflowTemplate, env: Executor, sparse: Trie,
                        truth: Trie, test_problems: list[str],
                        budgets: Sequence[float] | None = None,
                        axis: str = "cost") -> dict[str, Any]:
    """Accuracy and realised cost and latency per budget on ``axis`` (cost or latency):
    VineLM (sparse trie) vs best static."""
    invs = template.invocations()
    statics = [(a, static_path(template, a)) for a in static_assignments(template)]
    budgets = (list(budgets) if budgets is not None
               else static_budgets(template, truth, axis=axis))
    rows = []
    for c in budgets:
        obj = (Objective("max_accuracy", max_cost=c) if axis == "cost"
               else Objective("max_accuracy", max_latency_s=c))
        vine = [simulate(env, invs, x, vinelm_chooser(sparse, obj, True), lambda *_: 1.0)
                for x in test_problems]
        exact = [simulate(env, invs, x, vinelm_chooser(truth, obj, True), lambda *_: 1.0)
                 for x in test_problems]
        affordable = [(truth[p].accuracy, -getattr(truth[p], axis), p) for _, p in statics
                      if getattr(truth[p], axis) <= c + 1e-9]
        best = (max(affordable)[2] if affordable
                else min(statics, key=lambda s: getattr(truth[s[1]], axis))[1])
        stat = [simulate(env, invs, x, lambda pre, _e, b=best: (b[len(pre)], len(b)),
                         lambda *_: 1.0) for x in test_problems]
        rows.append({"budget": c,
                     "vinelm_accuracy": _mean(r[0] for r in vine),
                     "vinelm_cost": _mean(r[1] for r in vine),
                     "vinelm_latency_s": _mean(r[2] for r in vine),
                     "vinelm_exhaustive_trie_accuracy": _mean(r[0] for r in exact),
                     "vinelm_exhaustive_trie_cost": _mean(r[1] for r in exact),
                     "static_accuracy": _mean(r[0] for r in stat),
                     "static_cost": _mean(r[1] for r in stat),
                     "static_latency_s": _mean(r[2] for r in stat),
                     "static_assignment": list(best)})
    return {"test_problems": len(test_problems), "rows": rows}


def slo_targets(sparse: Trie) -> list[float]:
    """SLOs at the 25th, 50th and 75th percentile of the trie's leaf latencies."""
    leaf_lat = sorted(sparse[p].latency_s for p in sparse.leaves())
    return [leaf_lat[int(q * (len(leaf_lat) - 1))] for q in (0.25, 0.5, 0.75)]


def slowest_model(truth: Trie) -> str:
    """The model whose single-model longest path is slowest (the one load hurts most)."""
    return max(truth.invocations[0].models, key=lambda m: truth[(m,) * truth.depth].latency_s)


def slo_experiment(template: WorkflowTemplate, env: Executor, sparse: Trie,
                   test_problems: list[str], slowed: str, slow_factor: float,
                   slow_share: float, seed: int,
                   slos: Sequence[float] | None = None) -> dict[str, Any]:
    """Latency-SLO violations with and without re-rooting when model ``slowed``'s
    invocations are slowed (share ``slow_share``, factor ``slow_factor``)."""
    invs = template.invocations()
    rng_seed = seed

    def slow(problem: str, prefix: Path_) -> float:
        r = random.Random(f"{rng_seed}/{problem}/{prefix}").random()
        return slow_factor if prefix[-1] == slowed and r < slow_share else 1.0

    rows = []
    for slo in (list(slos) if slos is not None else slo_targets(sparse)):
        obj = Objective("max_accuracy", max_latency_s=slo)
        row: dict[str, Any] = {"slo_s": slo}
        for name, reroot in (("reroot", True), ("no_reroot", False)):
            res = [simulate(env, invs, x, vinelm_chooser(sparse, obj, reroot), slow)
                   for x in test_problems]
            row[f"{name}_violations"] = _mean(r[2] > slo for r in res)
            row[f"{name}_accuracy"] = _mean(r[0] for r in res)
        rows.append(row)
    return {"slow_model": slowed, "slow_factor": slow_factor, "slow_share": slow_share,
            "rows": rows}


def recorded_experiment(template: WorkflowTemplate, env: Executor, problems: list[str],
                        cascades_per_problem: int, settings: EstimationSettings, seed: int,
                        folds: int, slow_factor: float, slow_share: float) -> dict[str, Any]:
    """The three experiments on recorded real executions. Profiling: sparse vs exhaustive
    on every problem. Frontier and SLO: ``folds``-fold cross-fitting: each fold is held
    out while the sparse trie (and the static assignment's exhaustive choice) come from
    the other folds; rows are pooled over all held-out problems at budgets and SLOs fixed
    from the whole set."""
    report, sparse_all, truth_all = profiling_experiment(
        template, env, problems, cascades_per_problem, settings, seed, stop_at_success=True)
    budgets = {axis: static_budgets(template, truth_all, axis=axis) for axis in AXES}
    slos = slo_targets(sparse_all)
    slowed = slowest_model(truth_all)
    order = list(problems)
    random.Random(seed).shuffle(order)
    parts = [order[i::folds] for i in range(folds)]
    frontier: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {a: [] for a in AXES}
    slo = []
    for i, test in enumerate(parts):
        train = [p for j, part in enumerate(parts) if j != i for p in part]
        _, sparse, truth = profiling_experiment(template, env, train, cascades_per_problem,
                                                settings, seed + i, stop_at_success=True,
                                                progress=False)
        for axis in AXES:
            frontier[axis].append((len(test), frontier_experiment(
                template, env, sparse, truth, test, budgets[axis], axis)["rows"]))
        slo.append((len(test), slo_experiment(template, env, sparse, test, slowed,
                                              slow_factor, slow_share, seed, slos)["rows"]))
    return {"profiling": report,
            "frontier": {"test_problems": len(problems), "folds": folds,
                         "rows": _pool(frontier["cost"])},
            "latency_frontier": {"test_problems": len(problems), "folds": folds,
                                 "rows": _pool(frontier["latency_s"])},
            "slo": {"slow_model": slowed, "slow_factor": slow_factor,
                    "slow_share": slow_share, "folds": folds, "rows": _pool(slo)}}


def _pool(per_fold: list[tuple[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Row-wise means weighted by the folds' problem counts; lists are collected."""
    total = sum(n for n, _ in per_fold)
    out = []
    for rows in zip(*(r for _, r in per_fold)):
        row: dict[str, Any] = {}
        for key, first in rows[0].items():
            if isinstance(first, list):
                row[key + "s"] = [r[key] for r in rows]
            else:
                row[key] = sum(n * r[key] for (n, _), r in zip(per_fold, rows)) / total
        out.append(row)
    return out


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(float(x) for x in xs) / len(xs) if xs else 0.0


def plot(report: Mapping[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = report["frontier"]["rows"]
    for key, label in (("vinelm", "VineLM (sparse trie, re-rooted)"),
                       ("vinelm_exhaustive_trie", "VineLM (exhaustive trie)"),
                       ("static", "best static assignment (exhaustive)")):
        pts = sorted((r[f"{key}_cost"], r[f"{key}_accuracy"]) for r in rows)
        axes[0].plot([x for x, _ in pts], [y for _, y in pts], "o-", label=label)
        axes[1].plot([r["budget"] for r in rows], [r[f"{key}_accuracy"] for r in rows],
                     "o-", label=label)
    axes[0].set_xlabel("mean realised cost")
    axes[1].set_xlabel("per-request cost budget")
    for ax in axes:
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"VineLM on {report.get('environment', 'the synthetic environment')} "
                 f"({report['workflow']})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write(report: Mapping[str, Any], out: Path) -> None:
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out.with_suffix(".png"))

