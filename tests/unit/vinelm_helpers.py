"""Shared builders of the VineLM tests: invocations and random monotone tries."""

from __future__ import annotations

import random

from router.vinelm.estimate import build_trie
from router.vinelm.template import Invocation
from router.vinelm.trie import Trie, prefixes


def invocations(*levels: tuple[str, ...], answers: bool = True) -> list[Invocation]:
    return [Invocation(f"s{i}", models, answers, 0.0, 0.0) for i, models in enumerate(levels)]


def random_trie(rng: random.Random, depth: int, max_models: int = 3) -> Trie:
    """Random admissible models per depth and quantised random annotations (ties)."""
    pool = ["a", "b", "c", "d"]
    invs = invocations(*[tuple(rng.sample(pool, rng.randint(1, max_models)))
                         for _ in range(depth)])
    mu: dict[tuple[str, ...], float] = {(): 0.0}
    cost, lat = {}, {}
    for p in prefixes(invs):
        c = rng.choice([0.0, 0.25, 0.5, 0.75])
        mu[p] = mu[p[:-1]] + (1 - mu[p[:-1]]) * c
        cost[p], lat[p] = float(rng.randint(0, 3)), float(rng.randint(0, 3))
    del mu[()]
    return build_trie("t", invs, mu, cost, lat, {})
