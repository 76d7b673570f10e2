"""Annotating the trie from cascade observations (VineLM section 3.2).

Cascade sampling sees a node's outcome only for problems that failed at its parent, so
the naive success rate of the problems observed at a node (with subtree fill-in) is
biased: the missingness depends on the outcome. The cascade decomposition removes it:

    c(l1..lk)  = successes at (l1..lk) / executions of (l1..lk)   (parent had failed)
    mu(l1..lk) = mu(l1..lk-1) + (1 - mu(l1..lk-1)) x c(l1..lk),   mu(()) = 0

The deepest levels see few executions per node, so their conditional estimates are
smoothed: at each of the ``smooth_depths`` deepest depths, the matrix C[parent, model]
of conditional estimates is replaced by its weighted rank-``smooth_rank`` fit (weights:
execution counts; alternating least squares; a parent's row seen a few times is pulled
towards the common row with ``smooth_strength``), which also fills the unobserved cells.
Without that pull a row with one lucky execution keeps c = 1 and the controller chases it. A
node with no execution elsewhere (or a smoothed depth nobody reached) takes its (depth,
model) pooled rate, else its (stage, model) pooled rate, else 0.

Step cost and latency of a node are the mean over executions of its (depth, model),
else of its (stage, model); cumulative values add the folded tool stages.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from router.vinelm.profiling import Observations
from router.vinelm.template import Invocation
from router.vinelm.trie import Annotation, Path_, Trie, prefixes


@dataclass(frozen=True)
class EstimationSettings:
    smooth_rank: int = 1
    """Rank of the smoothing fit of the deepest conditional estimates (VineLM: rank-1)."""
    smooth_depths: int = 1
    """How many of the deepest depths are smoothed (0: none)."""
    smooth_strength: float = 5.0
    """Pull of a row's factor towards the common row in the smoothing fit, in
    pseudo-executions (``low_rank_fit``; 0: the plain rank-``smooth_rank`` fit)."""


def cascade_accuracy(parent_mu: float, conditional: float) -> float:
    """mu(l1..lk) = mu(l1..lk-1) + (1 - mu(l1..lk-1)) x c(l1..lk)."""
    return parent_mu + (1.0 - parent_mu) * conditional


def low_rank_fit(values: np.ndarray, weights: np.ndarray, rank: int, strength: float = 0.0,
                 iterations: int = 50) -> np.ndarray:
    """Weighted rank-``rank`` fit U V^T of ``values`` (weights 0 = unobserved) by
    alternating least squares, clipped to [0, 1]:

        min  sum_ij w_ij (C_ij - u_i . v_j)^2 + strength x sum_i |u_i - u_bar|^2

    with u_bar the count-weighted mean row factor (``strength`` in pseudo-executions:
    a row seen a few times is pulled towards the common row; 0: none). Rows or columns
    with no weight take the mean row / column factor."""
    rows, cols = values.shape
    rank = min(rank, rows, cols)
    rng = np.random.default_rng(0)
    u = np.ones((rows, rank)) + 0.01 * rng.standard_normal((rows, rank))
    v = np.full((cols, rank), float(np.average(values, weights=weights))
                if weights.sum() else 0.0)
    eye = np.eye(rank)
    row_n, col_n = weights.sum(1), weights.sum(0)
    seen_rows, seen_cols = row_n > 0, col_n > 0
    for _ in range(iterations):
        for j in range(cols):
            w = weights[:, j]
            if w.sum():
                v[j] = np.linalg.solve((u.T * w) @ u + 1e-6 * eye, (u.T * w) @ values[:, j])
        u_bar = np.average(u[seen_rows], axis=0, weights=row_n[seen_rows]) \
            if seen_rows.any() else u.mean(0)
        for i in range(rows):
            w = weights[i]
            if w.sum():
                u[i] = np.linalg.solve((v.T * w) @ v + (strength + 1e-6) * eye,
                                       (v.T * w) @ values[i] + strength * u_bar)
    if seen_rows.any():
        u[~seen_rows] = np.average(u[seen_rows], axis=0, weights=row_n[seen_rows])
    if seen_cols.any():
        v[~seen_cols] = np.average(v[seen_cols], axis=0, weights=col_n[seen_cols])
    return np.clip(u @ v.T, 0.0, 1.0)


def conditional_estimates(obs: Observations, invocations: Sequence[Invocation],
                          settings: EstimationSettings) -> dict[Path_, float]:
    """c(p) for every node: observed, pooled, or smoothed (deepest depths)."""
    pooled_n: dict[tuple[object, str], int] = defaultdict(int)
    pooled_s: dict[tuple[object, str], int] = defaultdict(int)
    for p, n in obs.runs.items():
        for k in ((len(p), p[-1]), (invocations[len(p) - 1].stage, p[-1])):
            pooled_n[k] += n
            pooled_s[k] += obs.successes[p]
    cond: dict[Path_, float] = {}
    for p in prefixes(invocations):
        n = obs.runs.get(p, 0)
        if n:
            cond[p] = obs.successes[p] / n
            continue
        keys = [k for k in ((len(p), p[-1]), (invocations[len(p) - 1].stage, p[-1]))
                if pooled_n[k]]
        cond[p] = pooled_s[keys[0]] / pooled_n[keys[0]] if keys else 0.0
    depth = len(invocations)
    for d in range(max(1, depth - settings.smooth_depths + 1), depth + 1):
        level = [p for p in cond if len(p) == d]
        parents = sorted({p[:-1] for p in level})
        models = list(invocations[d - 1].models)
        values = np.zeros((len(parents), len(models)))
        weights = np.zeros_like(values)
        for p in level:
            i, j = parents.index(p[:-1]), models.index(p[-1])
            weights[i, j] = obs.runs.get(p, 0)
            values[i, j] = obs.successes.get(p, 0) / weights[i, j] if weights[i, j] else 0.0
        if not weights.sum():
            continue
        fit = low_rank_fit(values, weights, settings.smooth_rank, settings.smooth_strength)
        for p in level:
            cond[p] = float(fit[parents.index(p[:-1]), models.index(p[-1])])
    return cond


def decomposed_accuracy(cond: dict[Path_, float],
                        invocations: Sequence[Invocation]) -> dict[Path_, float]:
    """mu for every node from the conditional estimates (root first)."""
    mu: dict[Path_, float] = {(): 0.0}
    for p in prefixes(invocations):
        mu[p] = cascade_accuracy(mu[p[:-1]], cond[p])
    del mu[()]
    return mu


def naive_accuracy(obs: Observations, invocations: Sequence[Invocation]) -> dict[Path_, float]:
    """The biased estimator: successes with subtree fill-in over the problems whose
    outcome at the node is known (a node nobody reached takes its parent's value)."""
    out: dict[Path_, float] = {}
    filled: dict[Path_, int] = {(): 0}
    for p in prefixes(invocations):
        filled[p] = filled[p[:-1]] + obs.successes.get(p, 0)
        known = filled[p] + obs.runs.get(p, 0) - obs.successes.get(p, 0)
        out[p] = filled[p] / known if known else out.get(p[:-1], 0.0)
    return out


def step_means(obs: Observations, invocations: Sequence[Invocation]
               ) -> tuple[dict[Path_, float], dict[Path_, float]]:
    """Per node: expected cost and latency of its own invocation (pooled means)."""
    sums: dict[tuple[object, ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for p, n in obs.runs.items():
        for key in ((len(p), p[-1]), (invocations[len(p) - 1].stage, p[-1])):
            s = sums[key]
            s[0] += n
            s[1] += obs.cost_sum[p]
            s[2] += obs.latency_sum[p]
    cost, lat = {}, {}
    for p in prefixes(invocations):
        inv = invocations[len(p) - 1]
        s = sums.get((len(p), p[-1])) or sums.get((inv.stage, p[-1]))
        if not s or not s[0]:
            raise ValueError(f"profiling never ran model {p[-1]!r} at stage {inv.stage!r}: "
                             "profile more problems (or more cascades per problem)")
        cost[p], lat[p] = s[1] / s[0], s[2] / s[0]
    return cost, lat


def build_trie(workflow: str, invocations: Sequence[Invocation],
               accuracy: dict[Path_, float], step_cost: dict[Path_, float],
               step_latency: dict[Path_, float], samples: dict[Path_, int]) -> Trie:
    """Cumulative annotations from per-node values, made monotone."""
    nodes: dict[Path_, Annotation] = {}
    for p in prefixes(invocations):
        inv = invocations[len(p) - 1]
        parent = nodes.get(p[:-1], Annotation(0.0, 0.0, 0.0))
        nodes[p] = Annotation(parent.cost + step_cost[p] + inv.tool_cost,
                              parent.latency_s + step_latency[p] + inv.tool_latency_s,
                              accuracy[p], samples.get(p, 0))
    return Trie(workflow, invocations, nodes).enforce_monotone()


def annotate(workflow: str, invocations: Sequence[Invocation], obs: Observations,
             settings: EstimationSettings) -> Trie:
    """The trie from cascade observations (decomposition + smoothing)."""
    mu = decomposed_accuracy(conditional_estimates(obs, invocations, settings), invocations)
    cost, lat = step_means(obs, invocations)
    return build_trie(workflow, invocations, mu, cost, lat, dict(obs.runs))
