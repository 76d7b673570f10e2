"""VineLM search: pruning against brute force on random tries, re-rooting, load delays."""

from __future__ import annotations

import random
from typing import Collection, Mapping

import pytest

from router.vinelm.estimate import build_trie
from router.vinelm.objective import Objective
from router.vinelm.search import objective_key, remaining_latency, search, violation
from router.vinelm.trie import Path_, Trie, prefixes
from tests.unit.vinelm_helpers import invocations, random_trie


def brute_force(trie: Trie, root: Path_, obj: Objective, elapsed: float,
                delays: Mapping[str, float], stop_depths: Collection[int] | None,
                first: Collection[str]) -> tuple[Path_, bool]:
    """Every candidate scored; the best feasible one, else the least violating one."""
    stops = set(range(len(root) + 1, trie.depth + 1)) if stop_depths is None else \
        {d for d in stop_depths if len(root) < d <= trie.depth} or {trie.depth}
    scored = []
    for q, a in trie.nodes.items():
        if len(q) in stops and q[:len(root)] == root and q[len(root)] in first:
            lat = elapsed + remaining_latency(trie, root, q, delays)
            scored.append((violation(obj, a.cost, lat, a.accuracy),
                           objective_key(obj, a.cost, lat, a.accuracy, q)))
    best = min(scored)
    return best[1][-1], best[0] == 0


def random_objective(rng: random.Random) -> Objective:
    if rng.random() < 0.5:
        return Objective("min_cost", min_accuracy=rng.choice([0.0, 0.3, 0.6, 0.9, 0.99]),
                         max_latency_s=rng.choice([None, 2.0, 5.0, 9.0]))
    cost = rng.choice([None, 1.0, 3.0, 6.0])
    lat = rng.choice([2.0, 5.0, 9.0]) if cost is None or rng.random() < 0.5 else None
    return Objective("max_accuracy", max_cost=cost, max_latency_s=lat)


def test_pruned_search_equals_brute_force_on_random_tries() -> None:
    rng = random.Random(7)
    pruned_some = feasible = infeasible = 0
    for _ in range(600):
        trie = random_trie(rng, rng.randint(1, 4))
        root: Path_ = ()
        for _ in range(rng.randint(0, trie.depth - 1)):
            root = rng.choice(trie.children(root))
        obj = random_objective(rng)
        elapsed = rng.choice([0.0, 1.0, 3.0])
        delays = {m: rng.choice([0.0, 0.0, 1.0, 2.0]) for m in "abcd"}
        stops = rng.choice([None, {trie.depth}, {len(root) + 1}, {99}])
        models = trie.invocations[len(root)].models
        first = set(rng.sample(models, rng.randint(1, len(models))))
        plan = search(trie, root, obj, elapsed, delays, stops, first)
        path, ok = brute_force(trie, root, obj, elapsed, delays, stops, first)
        assert (plan.path, plan.feasible) == (path, ok), (obj, root, stops)
        feasible += ok
        infeasible += not ok
        subtree = sum(1 for q in trie.nodes if len(q) > len(root) and q[:len(root)] == root
                      and q[len(root)] in first)
        pruned_some += ok and plan.expanded < subtree
    assert feasible > 200 and infeasible > 50 and pruned_some > 50


def two_model_trie() -> Trie:
    """Three answering calls; a: fast and weak (1 s, cost 1, c = 0.5), b: slow and strong
    (2 s, cost 3, c = 0.8)."""
    invs = invocations(("a", "b"), ("a", "b"), ("a", "b"))
    c, cost, lat = {"a": 0.5, "b": 0.8}, {"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 2.0}
    mu: dict[Path_, float] = {(): 0.0}
    for p in prefixes(invs):
        mu[p] = mu[p[:-1]] + (1 - mu[p[:-1]]) * c[p[-1]]
    del mu[()]
    return build_trie("t", invs, mu, {p: cost[p[-1]] for p in mu},
                      {p: lat[p[-1]] for p in mu}, {})


def test_reroot_after_a_slow_stage_switches_the_suffix() -> None:
    trie = two_model_trie()
    obj = Objective("max_accuracy", max_latency_s=6.0)
    assert search(trie, (), obj).path == ("b", "b", "b")      # 6 s, mu 0.992
    # the first call took the expected 2 s: the suffix stays b, b
    assert search(trie, ("b",), obj, elapsed_s=2.0).path == ("b", "b", "b")
    # it took 4.5 s: b, b (6.5 s) no longer fits; b, a (5.5 s, mu 0.9) does
    slow = search(trie, ("b",), obj, elapsed_s=4.5)
    assert slow.path == ("b", "a") and slow.feasible
    assert slow.latency_s == pytest.approx(5.5) and slow.accuracy == pytest.approx(0.9)


def test_load_delay_moves_the_next_call_off_a_busy_model() -> None:
    trie = two_model_trie()
    obj = Objective("max_accuracy", max_latency_s=6.0)
    assert search(trie, (), obj).path[0] == "b"
    busy = search(trie, (), obj, delays={"b": 4.0})   # every path using b: +4 s
    assert busy.path == ("a", "a", "a") and busy.latency_s == pytest.approx(3.0)


def test_min_cost_takes_the_cheapest_node_that_reaches_the_accuracy() -> None:
    trie = two_model_trie()
    plan = search(trie, (), Objective("min_cost", min_accuracy=0.7))
    assert plan.path == ("a", "a") and plan.cost == 2.0 and plan.accuracy == 0.75
    three = search(trie, (), Objective("min_cost", min_accuracy=0.7), stop_depths={3})
    assert three.path == ("a", "a", "a") and three.cost == 3.0


def test_unreachable_objective_returns_the_least_violating_plan() -> None:
    trie = two_model_trie()
    plan = search(trie, (), Objective("min_cost", min_accuracy=1.0))
    assert not plan.feasible
    assert plan.accuracy == max(a.accuracy for a in trie.nodes.values())


def test_search_refuses_a_leaf_root() -> None:
    trie = two_model_trie()
    with pytest.raises(ValueError, match="not an inner node"):
        search(trie, trie.leaves()[0], Objective("max_accuracy", max_cost=1.0))
