"""random_mix: a seeded share of programs on the big model, every stage of a program on
the same model, the least-loaded engine within it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from router.predictors.records import seeded_uniform
from tests.unit.test_policies_base import World, req


def mixed() -> World:
    return World({"s0": "small", "s1": "small", "b0": "big"})


def test_share_of_programs_on_the_big_model() -> None:
    w = mixed()
    p = w.build("random_mix", {"big_model": "big", "share": 0.3})
    models = [w.decide(p, req(f"r{i}", program_id=f"p{i}", stage_index=0)).model
              for i in range(2000)]
    assert 0.27 < models.count("big") / len(models) < 0.33


@pytest.mark.parametrize("share,expected", [(0.0, {"small"}), (1.0, {"big"})])
def test_share_bounds(share: float, expected: set[str]) -> None:
    w = mixed()
    p = w.build("random_mix", {"big_model": "big", "share": share})
    assert {w.decide(p, req(f"r{i}", program_id=f"p{i}")).model for i in range(50)} == expected


def test_stages_of_a_program_share_its_model_and_load_balance_within() -> None:
    w = mixed()
    w.load("s0", batch=5)
    w.load("s1", batch=1)
    p = w.build("random_mix", {"big_model": "big", "share": 0.5, "seed": 3})
    for i in range(20):
        first = w.decide(p, req("a", program_id=f"p{i}", stage_index=0))
        later = [w.decide(p, req(f"b{k}", program_id=f"p{i}", stage_index=k)).model
                 for k in (1, 2, 3)]
        assert set(later) == {first.model}
        assert first.instance in ("b0", "s1")  # s0 is the busier small engine


def test_other_model_when_the_chosen_one_has_no_candidate() -> None:
    w = World({"s0": "small", "b0": "big"})
    p = w.build("random_mix", {"big_model": "big", "share": 1.0})
    assert w.decide(p, req(program_id="p"), model="small").instance == "s0"


def test_unknown_big_model_fails_at_start() -> None:
    with pytest.raises(ValueError, match="big_model 'huge' is not served here"):
        mixed().build("random_mix", {"big_model": "huge"})
    with pytest.raises(ValueError, match="big_model '' is not served here"):
        mixed().build("random_mix", {})
    with pytest.raises(ValueError, match="share"):
        mixed().build("random_mix", {"big_model": "big", "share": 1.5})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=64), st.integers(0, 2**31), st.floats(0.0, 1.0))
def test_the_draw_is_a_threshold_in_share(key: str, seed: int, share: float) -> None:
    def to_big(s: float) -> bool:
        return seeded_uniform(key, seed) < s
    assert to_big(share) <= to_big(min(1.0, share + 0.1))
    assert not to_big(0.0) and to_big(1.0)


def test_a_long_big_model_names_its_own_bound() -> None:
    with pytest.raises(ValueError, match="big_model: must be at most 256 characters, got 300"):
        mixed().build("random_mix", {"big_model": "x" * 300})
