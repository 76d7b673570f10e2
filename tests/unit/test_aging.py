"""Pure aging bookkeeping: key order, promotion at S, demotion after Q."""

import pytest

from scheduler_patches.aging import AgingSettings, AgingTracker
from scheduler_patches.contract import PRIORITY_MAX


def tracker(S: int = 3, Q: int = 2, max_promotions: int = 4) -> AgingTracker:
    return AgingTracker(AgingSettings(starvation_threshold=S, quantum=Q,
                                      max_promotions=max_promotions))


def test_key_orders_by_level_then_priority_then_arrival():
    t = tracker()
    a = t.track("a", 50, 1.0)
    b = t.track("b", 10, 2.0)
    c = t.track("c", 10, 0.5)
    assert sorted([a, b, c], key=lambda e: e.key()) == [c, b, a]


def test_unprioritized_requests_sort_after_predicted_ones():
    t = tracker()
    none = t.track("none", 0, 0.0)
    big = t.track("big", PRIORITY_MAX - 1, 5.0)
    assert none.priority == PRIORITY_MAX
    assert big.key() < none.key()


def test_promotion_exactly_at_S_pass_overs():
    t = tracker(S=3)
    e = t.track("x", 100, 0.0)
    assert t.tick([]) == [] and t.tick([]) == []
    assert e.level == 0 and e.pass_overs(t.tick_count) == 2
    moved = t.tick([])
    assert moved == [e] and e.level == -1
    assert e.pass_overs(t.tick_count) == 0  # the count restarts at the new level


def test_promoted_again_after_another_S_and_capped():
    t = tracker(S=2, max_promotions=2)
    e = t.track("x", 100, 0.0)
    levels = []
    for _ in range(10):
        t.tick([])
        levels.append(e.level)
    assert levels == [0, -1, -1, -2, -2, -2, -2, -2, -2, -2]


def test_scheduled_request_is_not_passed_over():
    t = tracker(S=2)
    e = t.track("x", 100, 0.0)
    t.tick(["x"])  # scheduled: now running
    for _ in range(5):
        t.tick(["x"])
    assert e.level == 0 and not e.waiting


def test_demotion_after_Q_scheduling_iterations():
    t = tracker(S=1, Q=3)
    e = t.track("x", 100, 0.0)
    t.tick([])
    assert e.level == -1
    t.tick(["x"]); t.tick(["x"])
    assert e.level == -1 and e.served == 2
    t.tick(["x"])
    assert e.level == 0 and e.served == 0


def test_preempted_request_restarts_counting_and_keeps_level():
    t = tracker(S=2, Q=100)
    e = t.track("x", 100, 0.0)
    t.tick([]); t.tick([])
    assert e.level == -1
    t.tick(["x"])  # admitted
    t.track("x", 100, 0.0)  # preempted: back to waiting
    assert e.waiting and e.level == -1 and e.pass_overs(t.tick_count) == 0
    t.tick([]); t.tick([])
    assert e.level == -2


def test_re_add_within_a_step_keeps_the_count():
    t = tracker(S=3)
    e = t.track("x", 100, 0.0)
    t.tick([])
    assert t.track("x", 100, 0.0) is e  # skipped and re-queued by vLLM in one schedule()
    t.tick([]); t.tick([])
    assert e.level == -1


def test_forgotten_request_is_never_promoted():
    t = tracker(S=1)
    t.track("x", 100, 0.0)
    t.forget("x")
    assert t.tick([]) == []


@pytest.mark.parametrize("kwargs", [
    {"starvation_threshold": 0}, {"quantum": 0}, {"max_promotions": -1},
    {"unprioritized_priority": -5},
])
def test_invalid_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        AgingSettings(**kwargs)
