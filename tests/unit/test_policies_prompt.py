"""``Policy.uses_prompt``: a policy that declares it reads no prompt never reads one.

Each such policy decides, in a world whose engines are loaded and cache prompts, a
request whose prompt fields raise when read; a policy that reads them (even through its
predictors or the state view's prefix matching) fails. The same request makes ``filter``
(prefix-cache routing) fail, so the poison is seen through the view."""

from __future__ import annotations

from typing import Any

import pytest

from router.policies import POLICIES
from router.policies.pickers import PICKERS
from router.types import RoutingRequest
from tests.unit.test_policies_base import World

PROMPT_FIELDS = frozenset({"prompt_text", "system_text", "user_text", "prompt_token_ids",
                           "num_prompt_tokens"})


class PromptRead(AssertionError):
    """A policy read a prompt field."""


class Poisoned(RoutingRequest):
    """A request whose prompt fields raise ``PromptRead`` when read."""

    def __getattribute__(self, name: str) -> Any:
        if name in PROMPT_FIELDS:
            raise PromptRead(name)
        return super().__getattribute__(name)


def poisoned(rid: str) -> Poisoned:
    return Poisoned(request_id=rid, requested_model=None, prompt_text="p",
                    prompt_token_ids=list(range(100, 112)), num_prompt_tokens=12)


def world() -> World:
    w = World({"e0": "a", "e1": "a", "e2": "b"}, max_model_len=4096)
    for i, name in enumerate(("e0", "e1", "e2")):
        w.load(name, batch=i, waiting=2 - i, prefill=10 * i, decode=5)
        w.cache(name, list(range(100, 104 + 4 * i)))
    return w


PROMPT_FREE = sorted(name for name, p in POLICIES.items() if not p.uses_prompt)


def test_the_baselines_that_ignore_the_prompt_say_so() -> None:
    assert PROMPT_FREE == ["cascade", "random", "random_mix", "round_robin", "shortest_queue",
                           "vllm"]


@pytest.mark.parametrize("name", PROMPT_FREE)
def test_a_prompt_free_policy_reads_no_prompt_field(name: str) -> None:
    w = world()
    policy = w.build(name, {"random_mix": {"big_model": "b"},
                            "cascade": {"models": ["a", "b"]}}.get(name))
    seen = {w.decide(policy, poisoned(f"r{i}")).instance for i in range(6)}
    assert seen <= {"e0", "e1", "e2"}


@pytest.mark.parametrize("picker", sorted(n for n, p in PICKERS.items() if not p.uses_prompt))
def test_a_prompt_free_picker_reads_no_prompt_field(picker: str) -> None:
    w = world()
    policy = w.build("random_mix", {"big_model": "a", "share": 1.0, "picker": picker})
    assert not policy.uses_prompt
    seen = {w.decide(policy, poisoned(f"r{i}")).instance for i in range(6)}
    assert seen <= {"e0", "e1"}


def test_a_picker_that_reads_the_prompt_makes_its_policy_read_it() -> None:
    w = world()
    policy = w.build("random_mix", {"big_model": "a", "share": 1.0, "picker": "lmetric"})
    assert policy.uses_prompt
    with pytest.raises(PromptRead):
        w.decide(policy, poisoned("r"))


def test_the_poison_is_seen_through_the_state_view() -> None:
    w = world()
    with pytest.raises(PromptRead):
        w.decide(w.build("filter"), poisoned("r"))
