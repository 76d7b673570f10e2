"""cascade: a program starts on the cheapest model and each retry moves one rung up (the
models already tried for the stage, ``tried_models``); least-loaded engine within it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tests.unit.test_policies_base import World, req


def ladder() -> World:
    return World({"s0": "small", "s1": "small", "m0": "mid", "b0": "big"})


def test_each_retry_goes_one_rung_up_and_stays_on_the_last() -> None:
    w = ladder()
    p = w.build("cascade", {"models": ["small", "mid", "big"]})
    for tried, model in [((), "small"), (("small",), "mid"), (("small", "mid"), "big"),
                         (("small", "mid", "big"), "big"), (("mid",), "small"),
                         (("other",), "small")]:
        assert w.decide(p, req(program_id="p", tried_models=tried)).model == model, tried


def test_least_loaded_engine_of_the_rung() -> None:
    w = ladder()
    w.load("s0", batch=3, waiting=2)
    w.load("s1", batch=1)
    p = w.build("cascade", {"models": ["small", "big"]})
    assert w.decide(p, req(program_id="p")).instance == "s1"


def test_another_model_when_the_rung_has_no_candidate() -> None:
    w = World({"s0": "small", "b0": "big"})
    p = w.build("cascade", {"models": ["small", "big"]})
    assert w.decide(p, req(program_id="p", tried_models=("small",)),
                    model="small").instance == "s0"


@pytest.mark.parametrize("models,needle", [
    ([], "two or more distinct served models"), (["small"], "got \\['small'\\]"),
    (["small", "small"], "two or more distinct"), (["small", "huge"], "'huge' is not served"),
])
def test_a_bad_ladder_fails_at_start(models: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ladder().build("cascade", {"models": models})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["small", "mid", "big", "x" * 300, ""]), max_size=70))
def test_any_tried_list_routes_to_a_rung(tried: list[str]) -> None:
    w = ladder()
    p = w.build("cascade", {"models": ["small", "mid", "big"]})
    d = w.decide(p, req(program_id="p", tried_models=tuple(tried)))
    expected = next((m for m in ("small", "mid", "big") if m not in tried), "big")
    assert d.model == expected


@pytest.mark.parametrize("checked,tried,model", [
    (False, (), "big"), (False, ("big",), "big"), (True, (), "small"), (None, (), "small"),
    (True, ("small",), "mid")])
def test_a_program_without_a_check_starts_on_the_last_rung(
        checked: bool | None, tried: tuple[str, ...], model: str) -> None:
    w = ladder()
    p = w.build("cascade", {"models": ["small", "mid", "big"]})
    assert w.decide(p, req(program_id="p", tried_models=tried, checked=checked)).model == model
