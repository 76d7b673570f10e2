"""Searching the re-rooted subtrie for the best stopping node (VineLM section 4).

The trie is re-rooted at the realised prefix r. A candidate is a node q below r (at an
allowed stopping depth) with

    cost(q)     = annotated cumulative cost of q
    latency(q)  = elapsed_s + (latency(q) - latency(r)) + sum of delay[m] over the
                  distinct models m on q's part below r       (load-aware adjustment)
    accuracy(q) = annotated accuracy of q

Cost objective (min cost s.t. accuracy >= a, latency <= l): depth-first search with an
incumbent; a subtree is pruned when its root costs more than the incumbent or already
exceeds l (both only grow downwards). Accuracy objective (max accuracy s.t. cost <= c,
latency <= l): a subtree is pruned when its root violates a budget. Ties: cost
objective by (cost, -accuracy, latency, path), accuracy objective by (-accuracy, cost,
latency, path). When no candidate is feasible, the one with the smallest relative
constraint violation is chosen (ties as above) and the plan says ``feasible = False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from router.vinelm.objective import Objective
from router.vinelm.trie import Path_, Trie


@dataclass(frozen=True)
class Plan:
    path: Path_
    """The chosen stopping node (from the trie's root)."""
    cost: float
    latency_s: float
    """Predicted total latency (elapsed + remaining + load delays)."""
    accuracy: float
    feasible: bool
    expanded: int
    """Nodes the search visited."""


def remaining_latency(trie: Trie, root: Path_, node: Path_,
                      delays: Mapping[str, float]) -> float:
    """latency(node) - latency(root) + sum of delay[m] over distinct models below root."""
    return (trie[node].latency_s - trie[root].latency_s
            + sum(delays.get(m, 0.0) for m in set(node[len(root):])))


def objective_key(obj: Objective, cost: float, latency: float, accuracy: float,
                  path: Path_) -> tuple[float, float, float, Path_]:
    if obj.kind == "min_cost":
        return (cost, -accuracy, latency, path)
    return (-accuracy, cost, latency, path)


def violation(obj: Objective, cost: float, latency: float, accuracy: float) -> float:
    """Largest relative constraint violation (0: feasible)."""
    v = 0.0
    if obj.min_accuracy is not None:
        v = max(v, (obj.min_accuracy - accuracy) / max(obj.min_accuracy, 1e-9))
    if obj.max_cost is not None:
        v = max(v, (cost - obj.max_cost) / max(obj.max_cost, 1e-9))
    if obj.max_latency_s is not None:
        v = max(v, (latency - obj.max_latency_s) / obj.max_latency_s)
    return max(v, 0.0)


def search(trie: Trie, root: Path_, obj: Objective, elapsed_s: float = 0.0,
           delays: Mapping[str, float] | None = None,
           stop_depths: Collection[int] | None = None,
           first_models: Collection[str] | None = None) -> Plan:
    """The best stopping node below ``root`` (pruned DFS; see the module docstring);
    ``first_models`` restricts the next invocation's model (the ones that are up)."""
    if not trie.is_node(root) or len(root) >= trie.depth:
        raise ValueError(f"{list(root)} is not an inner node of the trie of "
                         f"{trie.workflow!r} (depth {trie.depth})")
    delays = delays or {}
    stops = set(range(len(root) + 1, trie.depth + 1)) if stop_depths is None \
        else {d for d in stop_depths if len(root) < d <= trie.depth}
    if not stops:
        stops = {trie.depth}
    firsts = [q for q in trie.children(root) if first_models is None or q[-1] in first_models]
    if not firsts:
        raise ValueError("no allowed model for the next invocation")
    best: tuple[tuple[float, float, float, Path_], Plan] | None = None
    expanded = 0
    stack = list(reversed(firsts))
    while stack:
        q = stack.pop()
        expanded += 1
        a = trie[q]
        lat = elapsed_s + remaining_latency(trie, root, q, delays)
        if obj.max_latency_s is not None and lat > obj.max_latency_s:
            continue
        if obj.kind == "min_cost":
            if best is not None and a.cost > best[1].cost:
                continue
            ok = obj.min_accuracy is None or a.accuracy >= obj.min_accuracy
        else:
            if obj.max_cost is not None and a.cost > obj.max_cost:
                continue
            ok = True
        if ok and len(q) in stops:
            key = objective_key(obj, a.cost, lat, a.accuracy, q)
            if best is None or key < best[0]:
                best = (key, Plan(q, a.cost, lat, a.accuracy, True, 0))
        stack.extend(reversed(trie.children(q)))
    if best is not None:
        return _with_expanded(best[1], expanded)
    return _least_violating(trie, root, obj, elapsed_s, delays, stops, firsts, expanded)


def _least_violating(trie: Trie, root: Path_, obj: Objective, elapsed_s: float,
                     delays: Mapping[str, float], stops: set[int], firsts: list[Path_],
                     expanded: int) -> Plan:
    best: tuple[tuple[float, tuple[float, float, float, Path_]], Plan] | None = None
    stack = list(firsts)
    while stack:
        q = stack.pop()
        expanded += 1
        stack.extend(trie.children(q))
        if len(q) not in stops:
            continue
        a = trie[q]
        lat = elapsed_s + remaining_latency(trie, root, q, delays)
        key = (violation(obj, a.cost, lat, a.accuracy),
               objective_key(obj, a.cost, lat, a.accuracy, q))
        if best is None or key < best[0]:
            best = (key, Plan(q, a.cost, lat, a.accuracy, False, 0))
    assert best is not None  # stops is never empty and every depth has nodes
    return _with_expanded(best[1], expanded)


def _with_expanded(p: Plan, expanded: int) -> Plan:
    return Plan(p.path, p.cost, p.latency_s, p.accuracy, p.feasible, expanded)
