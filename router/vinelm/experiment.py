"""Experiments on an environment whose exhaustive ground truth is known (synthetic).

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
from router.vinelm.profiling import GroundTruth, cascade_sample, exhaustive
from router.vinelm.search import search
from router.vinelm.synthetic import SyntheticEnv
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


def profiling_experiment(template: WorkflowTemplate, env: SyntheticEnv, problems: list[str],
                         cascades_per_problem: int, settings: EstimationSettings,
                         seed: int) -> tuple[dict[str, Any], Trie, Trie]:
    """Errors and cost fractions; returns (report, sparse trie, exhaustive trie)."""
    invs = template.invocations()
    gt = exhaustive(env, invs, problems, progress=True)
    obs = cascade_sample(env, invs, problems, cascades_per_problem, seed, progress=True)
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


def simulate(env: SyntheticEnv, invocations: Sequence[Invocation], problem: str,
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


def frontier_experiment(template: WorkflowTemplate, env: SyntheticEnv, sparse: Trie,
                        truth: Trie, test_problems: list[str], points: int = 8
                        ) -> dict[str, Any]:
    """Accuracy and realised cost per budget: VineLM (sparse trie) vs best static."""
    invs = template.invocations()
    statics = [(a, static_path(template, a)) for a in static_assignments(template)]
    costs = sorted(truth[p].cost for _, p in statics)
    budgets = [costs[0] + (costs[-1] - costs[0]) * i / (points - 1) for i in range(points)]
    rows = []
    for c in budgets:
        obj = Objective("max_accuracy", max_cost=c)
        vine = [simulate(env, invs, x, vinelm_chooser(sparse, obj, True), lambda *_: 1.0)
                for x in test_problems]
        exact = [simulate(env, invs, x, vinelm_chooser(truth, obj, True), lambda *_: 1.0)
                 for x in test_problems]
        affordable = [(truth[p].accuracy, -truth[p].cost, p) for _, p in statics
                      if truth[p].cost <= c + 1e-9]
        best = max(affordable)[2] if affordable else min(statics, key=lambda s: truth[s[1]].cost)[1]
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


def slo_experiment(template: WorkflowTemplate, env: SyntheticEnv, sparse: Trie,
                   test_problems: list[str], slow_factor: float, slow_share: float,
                   seed: int) -> dict[str, Any]:
    """Latency-SLO violations with and without re-rooting when the costliest model's
    invocations are slowed (share ``slow_share``, factor ``slow_factor``)."""
    invs = template.invocations()
    costly = max(env.cost, key=lambda m: env.cost[m])
    rng_seed = seed

    def slow(problem: str, prefix: Path_) -> float:
        r = random.Random(f"{rng_seed}/{problem}/{prefix}").random()
        return slow_factor if prefix[-1] == costly and r < slow_share else 1.0

    leaf_lat = sorted(sparse[p].latency_s for p in sparse.leaves())
    rows = []
    for q in (0.25, 0.5, 0.75):
        slo = leaf_lat[int(q * (len(leaf_lat) - 1))]
        obj = Objective("max_accuracy", max_latency_s=slo)
        row: dict[str, Any] = {"slo_s": slo}
        for name, reroot in (("reroot", True), ("no_reroot", False)):
            res = [simulate(env, invs, x, vinelm_chooser(sparse, obj, reroot), slow)
                   for x in test_problems]
            row[f"{name}_violations"] = _mean(r[2] > slo for r in res)
            row[f"{name}_accuracy"] = _mean(r[0] for r in res)
        rows.append(row)
    return {"slow_model": costly, "slow_factor": slow_factor, "slow_share": slow_share,
            "rows": rows}


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
    fig.suptitle(f"VineLM on the synthetic environment ({report['workflow']})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write(report: Mapping[str, Any], out: Path) -> None:
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out.with_suffix(".png"))

