"""LMETRIC: prefill x batch size, and the two-phase hotspot detector.

Prompt: 12 tokens, blocks of 4; a caching engine serves 8 of them (P - C = 4)."""

from __future__ import annotations

from router.policies.pickers.lmetric import hotspot_phase1, lmetric_score, new_prefill_tokens
from tests.unit.test_policies_base import World, req

PROMPT = list(range(100, 112))
OTHER = list(range(500, 512))


def test_formulas() -> None:
    assert new_prefill_tokens(prompt=12, cached=8, queued_prefill=30) == 34
    assert lmetric_score(prefill=34, batch_size=3) == 102
    assert hotspot_phase1(x=3, x_bar=2, m=1, m_bar=2)        # 3/2 > 1/2
    assert not hotspot_phase1(x=1, x_bar=2, m=1, m_bar=2)    # 1/2 = 1/2: not above
    assert hotspot_phase1(x=1, x_bar=0, m=1, m_bar=1)        # x-bar = 0


def test_kv_affinity_against_load() -> None:
    w = World({"e0": "a", "e1": "a"})
    w.cache("e0", PROMPT)
    p = w.build("lmetric", {"hotspot_detection": False})
    r = req(tokens=PROMPT)
    w.load("e0", batch=2)            # 4 x 2 = 8
    w.load("e1", batch=1)            # 12 x 1 = 12
    assert w.decide(p, r).instance == "e0"
    w.load("e0", batch=4)            # 4 x 4 = 16 > 12
    assert w.decide(p, r).instance == "e1"
    w.load("e1", batch=1, prefill=100)   # (12 + 100) x 1 = 112
    assert w.decide(p, r).instance == "e0"


def test_count_arriving_keeps_a_program_off_an_idle_engine() -> None:
    # LMETRIC's b_i: the idle engine scores 0 and wins whatever it must prefill; with the
    # arriving request counted, the engine caching the prefix wins until its batch costs
    # more than the idle engine's whole prompt.
    w = World({"e0": "a", "e1": "a"})
    w.cache("e0", PROMPT)
    w.load("e0", batch=2)
    w.load("e1", batch=0)
    r = req(tokens=PROMPT)
    assert w.decide(w.build("lmetric", {"hotspot_detection": False}), r).instance == "e1"
    sticky = w.build("lmetric", {"hotspot_detection": False, "count_arriving": True})
    assert lmetric_score(4, 2, count_arriving=True) == 12
    assert w.decide(sticky, r).instance == "e0"        # 4 x 3 = 12 ties 12 x 1: fewer prefill
    w.load("e0", batch=3)                               # 4 x 4 = 16 > 12
    assert w.decide(sticky, r).instance == "e1"


def test_ties_go_to_fewer_prefill_tokens() -> None:
    w = World({"e0": "a", "e1": "a"})
    w.cache("e1", PROMPT)
    w.load("e0", batch=1)            # 12 x 1 = 12, prefill 12
    w.load("e1", batch=3)            # 4 x 3 = 12, prefill 4
    assert w.decide(w.build("lmetric"), req(tokens=PROMPT)).instance == "e1"
    w.load("e0", batch=0)            # idle engines all score 0: KV decides
    w.load("e1", batch=0)
    assert w.decide(w.build("lmetric"), req(tokens=PROMPT)).instance == "e1"


def hot_world() -> World:
    """e0 caches the prefix and carries 3 requests; e1 and e2 carry 1 each.
    x / x-bar = 3 / 2 > |M| / |M-bar| = 1 / 2 (phase 1), and e0 wins: 4 x 3 = 12 ties
    e1's 12 x 1 and has fewer prefill tokens."""
    w = World({"e0": "a", "e1": "a", "e2": "a"})
    w.cache("e0", PROMPT)
    w.load("e0", batch=3)
    w.load("e1", batch=1)
    w.load("e2", batch=1)
    return w


def test_hotspot_after_more_than_2M_consecutive_wins() -> None:
    w = hot_world()
    p = w.build("lmetric", {"hot_top_k": 1})
    got = [w.decide(p, req(tokens=PROMPT)) for _ in range(4)]
    # |M| = 1: wins 1 and 2 pass, the 3rd exceeds 2|M| -> hotspot, diverted to M-bar
    assert [(d.instance, d.info["hotspot"]) for d in got] == [
        ("e0", False), ("e0", False), ("e1", True), ("e1", True)]


def test_hotspot_ends_when_phase_1_stops_holding() -> None:
    w = hot_world()
    p = w.build("lmetric", {"hot_top_k": 1})
    for _ in range(3):
        w.decide(p, req(tokens=PROMPT))
    w.load("e0", batch=1)   # x / x-bar = 1 / 2: not above 1 / 2
    d = w.decide(p, req(tokens=PROMPT))
    assert (d.instance, d.info["hotspot"]) == ("e0", False)
    w.load("e0", batch=3)   # phase 1 again, but the streak starts over
    assert [w.decide(p, req(tokens=PROMPT)).info["hotspot"] for _ in range(3)] == [
        False, False, True]


def test_phase_1_needs_disproportionate_load() -> None:
    w = hot_world()
    w.load("e0", batch=1)   # balanced: x / x-bar = 1 / 2 = |M| / |M-bar|
    w.load("e1", batch=2)   # e0: 4 x 1 = 4 wins every time
    p = w.build("lmetric", {"hot_top_k": 1})
    assert {(d.instance, d.info["hotspot"]) for d in
            (w.decide(p, req(tokens=PROMPT)) for _ in range(8))} == {("e0", False)}


def test_a_loss_resets_the_streak() -> None:
    w = hot_world()
    p = w.build("lmetric", {"hot_top_k": 1})
    w.decide(p, req(tokens=PROMPT))
    w.decide(p, req(tokens=PROMPT))
    w.load("e2", batch=0)   # e2 scores 0 and wins: the streak of M resets
    assert w.decide(p, req(tokens=PROMPT)).instance == "e2"
    w.load("e2", batch=1)
    assert [w.decide(p, req(tokens=PROMPT)).info["hotspot"] for _ in range(3)] == [
        False, False, True]


def test_only_the_hottest_classes_are_examined() -> None:
    w = hot_world()
    w.cache("e1", OTHER)
    p = w.build("lmetric", {"hot_top_k": 1})
    for _ in range(5):      # the OTHER class is hotter
        w.decide(p, req(tokens=OTHER))
    assert {w.decide(p, req(tokens=PROMPT)).info["hotspot"] for _ in range(4)} == {False}


def test_short_prompts_have_no_class_and_detection_can_be_off() -> None:
    w = hot_world()
    p = w.build("lmetric", {"hot_top_k": 1})
    assert {w.decide(p, req(tokens=PROMPT[:3])).info["hotspot"] for _ in range(5)} == {False}
    off = w.build("lmetric", {"hotspot_detection": False})
    assert {w.decide(off, req(tokens=PROMPT)).instance for _ in range(5)} == {"e0"}
