"""Baselines: round_robin, random, vllm, shortest_queue, linear, filter, dynamo.

Prompts are 12 tokens in blocks of 4: an engine caching all three blocks serves 8 of
them from cache (vLLM recomputes the last token, hence the whole last block)."""

from __future__ import annotations

import pytest

from router.policies.dynamo import dynamo_cost
from router.policies.linear import linear_score
from router.policies.prefix_filter import imbalanced
from router.policies.pickers.least_loaded import vllm_score
from router.state.inflight import InflightRecord
from tests.unit.test_policies_base import World, req

PROMPT = list(range(100, 112))


def three() -> World:
    return World({"e0": "a", "e1": "a", "e2": "a"})


def test_round_robin_cycles() -> None:
    w = three()
    p = w.build("round_robin")
    assert [w.decide(p, req()).instance for _ in range(4)] == ["e0", "e1", "e2", "e0"]


def test_random_is_seeded_and_reproducible() -> None:
    w = three()
    a, b = w.build("random", {"seed": 7}), w.build("random", {"seed": 7})
    run_a = [w.decide(a, req()).instance for _ in range(20)]
    run_b = [w.decide(b, req()).instance for _ in range(20)]
    assert run_a == run_b and set(run_a) == {"e0", "e1", "e2"}
    other = w.build("random", {"seed": 8})
    assert [w.decide(other, req()).instance for _ in range(20)] != run_a


def test_vllm_score_and_choice() -> None:
    assert vllm_score(waiting=2, running=3) == 11
    w = three()
    w.load("e0", batch=0, waiting=1)   # 4
    w.load("e1", batch=3)              # 3
    w.load("e2", batch=5)              # 5
    assert w.decide(w.build("vllm"), req()).instance == "e1"


def test_vllm_tie_goes_to_the_first_engine() -> None:
    w = three()
    w.load("e0", batch=4)              # 4
    w.load("e1", waiting=1)            # 4
    w.load("e2", batch=9)
    assert w.decide(w.build("vllm"), req()).instance == "e0"


def test_vllm_counts_unreported_requests_as_waiting() -> None:
    w = three()
    w.load("e0", batch=2)
    w.load("e1", batch=3)
    w.load("e2", batch=9)
    w.ledger.add(InflightRecord("x", "e0", "a", 0.0, 0, 0, sent_wall=5.0))
    assert w.decide(w.build("vllm"), req()).instance == "e1"   # e0: 4*1 + 2 = 6 > 3


def test_shortest_queue() -> None:
    w = three()
    w.load("e0", batch=2, waiting=2)
    w.load("e1", batch=3)
    w.load("e2", batch=1, waiting=3)
    assert w.decide(w.build("shortest_queue"), req()).instance == "e1"


def test_linear_score_and_weights() -> None:
    assert linear_score(hit_ratio=0.5, load=2, max_load=4, w_kv=1, w_load=1) == 0.0
    assert linear_score(0.5, 0, 0, 1, 1) == 0.5
    w = World({"e0": "a", "e1": "a"})
    w.cache("e0", PROMPT)
    w.load("e0", batch=4)      # hit 8/12, load term 4/4:  0.667 - 1 = -0.333
    w.load("e1", batch=0)      # hit 0, load 0:              0
    r = req(tokens=PROMPT)
    assert w.decide(w.build("linear"), r).instance == "e1"
    # w_kv = 2: e0 = 1.333 - 1 = 0.333 > 0
    assert w.decide(w.build("linear", {"kv_weight": 2.0}), r).instance == "e0"


@pytest.mark.parametrize("loads,expected", [([9, 1], False), ([10, 1], True), ([3], False)])
def test_filter_imbalance_boundary(loads: list[int], expected: bool) -> None:
    assert imbalanced(loads, 8) is expected


def test_filter_balances_only_beyond_the_range() -> None:
    w = World({"e0": "a", "e1": "a"})
    w.cache("e0", PROMPT)
    r = req(tokens=PROMPT)
    w.load("e0", batch=9)
    w.load("e1", batch=1)      # spread 8: not beyond the range -> prefix
    d = w.decide(w.build("filter"), r)
    assert (d.instance, d.info["mode"]) == ("e0", "prefix")
    w.load("e0", batch=10)     # spread 9 -> balance
    d = w.decide(w.build("filter"), r)
    assert (d.instance, d.info["mode"]) == ("e1", "balance")


def test_filter_prefix_ties_go_to_the_least_loaded() -> None:
    w = World({"e0": "a", "e1": "a"})
    w.load("e0", batch=3)
    w.load("e1", batch=2)
    assert w.decide(w.build("filter"), req(tokens=PROMPT)).instance == "e1"


def test_dynamo_cost_and_weight() -> None:
    assert dynamo_cost(queued_prefill=100, prompt=12, cached=8, decode_load=50, w=1) == 154
    w = World({"e0": "a", "e1": "a"})
    w.cache("e0", PROMPT)
    w.load("e0", prefill=100, decode=50)   # 1 x (100 + 12 - 8) + 50 = 154
    w.load("e1", decode=150)               # 1 x (0 + 12 - 0) + 150 = 162
    r = req(tokens=PROMPT)
    assert w.decide(w.build("dynamo"), r).instance == "e0"
    # w = 2: e0 = 208 + 50 = 258, e1 = 24 + 150 = 174
    assert w.decide(w.build("dynamo", {"overlap_score_weight": 2.0}), r).instance == "e1"
