"""The execution trie: construction, monotonicity, profile files; and its annotation by
cascade profiling (decomposition, fill-in, smoothing, checkpoint reuse)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from router.vinelm.estimate import (EstimationSettings, annotate, conditional_estimates,
                                    decomposed_accuracy, low_rank_fit, naive_accuracy)
from router.vinelm.profiling import Observations, Outcome, cascade_sample, exhaustive
from router.vinelm.synthetic import default_env
from router.vinelm.template import parse_template
from router.vinelm.trie import ProfileError, Trie, load_tries, prefixes, save_tries
from tests.unit.vinelm_helpers import invocations, random_trie

TEMPLATE = parse_template("math", {
    "stages": [{"name": "planner", "models": ["a", "b", "c"]},
               {"name": "solver", "models": ["a", "b"], "answers": True},
               {"name": "verifier", "models": ["a", "b"]}],
    "loop": {"from": "verifier", "to": "solver", "max_iterations": 1}})


def test_trie_has_a_node_per_prefix_and_repeated_stages_are_distinct_depths() -> None:
    invs = TEMPLATE.invocations()
    nodes = list(prefixes(invs))
    assert len(nodes) == 3 + 3 * 2 + 3 * 2 * 2 + 3 * 2 * 2 * 2
    assert len(set(nodes)) == len(nodes)
    trie = random_trie(random.Random(0), 3)
    assert trie.children(()) == [(m,) for m in trie.invocations[0].models]
    assert all(len(p) == trie.depth for p in trie.leaves())
    assert trie.children(trie.leaves()[0]) == []


def test_monotone_check_finds_a_violation_and_enforce_repairs_it() -> None:
    trie = random_trie(random.Random(1), 3)
    trie.check_monotone()
    leaf = trie.leaves()[0]
    nodes = dict(trie.nodes)
    nodes[leaf] = replace(nodes[leaf], accuracy=-1.0, cost=-1.0)
    bad = Trie("t", trie.invocations, nodes)
    assert {f for _, f in bad.violations()} == {"accuracy", "cost"}
    with pytest.raises(ValueError, match="not monotone"):
        bad.check_monotone()
    fixed = bad.enforce_monotone()
    fixed.check_monotone()
    assert fixed[leaf].accuracy == fixed[leaf[:-1]].accuracy


def test_missing_node_is_an_error() -> None:
    trie = random_trie(random.Random(2), 2)
    nodes = {p: a for p, a in trie.nodes.items() if p != trie.leaves()[0]}
    with pytest.raises(ValueError, match="no annotation"):
        Trie("t", trie.invocations, nodes)


def test_profile_file_round_trip_and_template_check(tmp_path: Path) -> None:
    invs = TEMPLATE.invocations()
    env = default_env(invs, seed=3)
    obs = cascade_sample(env, invs, [f"p{i}" for i in range(200)], 1, seed=0)
    trie = annotate("math", invs, obs, EstimationSettings())
    path = tmp_path / "tries.json"
    save_tries(path, {"math": trie.to_json(TEMPLATE, {"problems": 200})})
    back = load_tries(path, {"math": TEMPLATE})["math"]
    assert back.nodes == trie.nodes
    other = parse_template("math", {"stages": [{"name": "solver", "models": ["a"],
                                                "answers": True}]})
    with pytest.raises(ProfileError, match="another template"):
        load_tries(path, {"math": other})
    with pytest.raises(ProfileError, match="no trie for workflow 'code'"):
        load_tries(path, {"code": TEMPLATE})
    data = json.loads(path.read_text())
    data["workflows"]["math"]["nodes"][-1]["accuracy"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="not monotone"):
        load_tries(path, {"math": TEMPLATE})


def hand_observations() -> Observations:
    """Depth 1: a 4/10, b 6/10. Depth 2 (after failures): (a,a) 1/3, (a,b) 3/3,
    (b,a) 0/2, (b,b) 1/2."""
    obs = Observations()
    for p, n, s in [(("a",), 10, 4), (("b",), 10, 6), (("a", "a"), 3, 1), (("a", "b"), 3, 3),
                    (("b", "a"), 2, 0), (("b", "b"), 2, 1)]:
        for i in range(n):
            obs.record(p, Outcome(i < s, 1.0, 1.0))
    return obs


def test_cascade_decomposition_on_a_hand_made_example() -> None:
    invs = invocations(("a", "b"), ("a", "b"))
    cond = conditional_estimates(hand_observations(), invs, EstimationSettings(smooth_depths=0))
    mu = decomposed_accuracy(cond, invs)
    # mu(l1, l2) = mu(l1) + (1 - mu(l1)) x c(l1, l2)
    assert mu == pytest.approx({("a",): 0.4, ("b",): 0.6, ("a", "a"): 0.4 + 0.6 / 3,
                                ("a", "b"): 1.0, ("b", "a"): 0.6, ("b", "b"): 0.8})
    naive = naive_accuracy(hand_observations(), invs)
    # fill-in over the observed problems only: (4 + 1) / (4 + 3) for (a, a)
    assert naive[("a", "a")] == pytest.approx(5 / 7)
    assert naive[("b", "b")] == pytest.approx(7 / 8)


def test_rank_one_fit_recovers_a_rank_one_matrix_and_fills_missing_cells() -> None:
    u, v = np.array([0.5, 1.0, 0.8, 0.3]), np.array([0.4, 0.9])
    values = np.outer(u, v)
    weights = np.ones_like(values)
    weights[2, 1] = 0.0     # unobserved
    observed = values.copy()
    observed[2, 1] = 0.0
    fit = low_rank_fit(observed, weights, rank=1)
    assert fit == pytest.approx(values, abs=1e-4)


def test_smoothing_pulls_a_lucky_sparse_row_towards_the_common_row() -> None:
    values = np.array([[0.5, 0.8]] * 6 + [[0.0, 1.0]])
    weights = np.array([[20.0, 20.0]] * 6 + [[0.0, 2.0]])   # last row: 2 of 2 by luck
    plain = low_rank_fit(values, weights, rank=1)
    assert plain[6, 1] == pytest.approx(1.0, abs=1e-3)
    pulled = low_rank_fit(values, weights, rank=1, strength=5.0)
    assert 0.8 < pulled[6, 1] < 0.95
    assert pulled[:6] == pytest.approx(values[:6], abs=0.01)


def test_checkpoints_are_reused_and_counted() -> None:
    calls: list[tuple[str, tuple[str, ...]]] = []

    class Never:
        def run(self, problem: str, prefix: tuple[str, ...]) -> Outcome:
            calls.append((problem, prefix))
            return Outcome(False, 2.0, 1.0)

    invs = invocations(("a",), ("a",), ("a",))
    obs = cascade_sample(Never(), invs, ["x", "y"], cascades_per_problem=3, seed=0)
    assert len(calls) == len(set(calls)) == 6          # 3 depths x 2 problems, once each
    assert obs.executions == 6 and obs.executed_cost == 12.0
    assert obs.runs[("a", "a", "a")] == 2


def test_decomposition_removes_the_cascade_bias_that_fill_in_keeps() -> None:
    invs = invocations(("a", "b", "c"), ("a", "b", "c"))
    env = default_env(invs, seed=5)
    problems = [f"p{i}" for i in range(3000)]
    truth = exhaustive(env, invs, problems)
    obs = cascade_sample(env, invs, problems, 1, seed=1)
    mu = decomposed_accuracy(conditional_estimates(obs, invs, EstimationSettings(
        smooth_depths=0)), invs)
    naive = naive_accuracy(obs, invs)
    err = np.mean([abs(mu[p] - truth.accuracy[p]) for p in mu])
    err_naive = np.mean([abs(naive[p] - truth.accuracy[p]) for p in mu])
    assert err < 0.03 and err_naive > 2 * err
    assert obs.executions < 0.2 * truth.executions
