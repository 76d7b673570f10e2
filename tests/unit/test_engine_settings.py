"""The priority and ``max_tokens`` the router sends an engine (``router.proxy.engine_settings``)
for each way an engine takes priorities (``router.config.engines.priority_wire``)."""

from __future__ import annotations

import pytest

from router.proxy import engine_settings
from router.request import ParsedRequest
from router.types import Decision
from scheduler_patches.contract import PRIORITY_MAX


def _parsed(client_priority: int | None = None, **kw: dict[str, int]) -> ParsedRequest:
    return ParsedRequest(kind="chat", body={}, model=None, stream=False, include_usage=False,
                         max_tokens=None, max_tokens_param="max_tokens",
                         client_priority=client_priority, **kw)


def _decision(priority: int | None, max_tokens: int | None = None) -> Decision:
    return Decision("r", "big-0", "big", "http://127.0.0.1:1", "p", priority=priority,
                    max_tokens=max_tokens)


@pytest.mark.parametrize("wire, predicted, sent", [
    ("hetserve", 40, 40), ("hetserve", None, None),  # the engine maps none to its own
    ("stock", 40, 40), ("stock", None, PRIORITY_MAX), ("stock", 0, PRIORITY_MAX),
    ("none", 40, None), ("none", None, None),
])
def test_priority_per_wire(wire: str, predicted: int | None, sent: int | None) -> None:
    assert engine_settings(_parsed(), _decision(predicted), wire)[0] == sent  # type: ignore[arg-type]


def test_client_priority_first_then_per_model_then_policy() -> None:
    assert engine_settings(_parsed(7, model_priority={"big": 9}), _decision(40))[0] == 7
    assert engine_settings(_parsed(model_priority={"big": 9}), _decision(40))[0] == 9
    assert engine_settings(_parsed(model_priority={"small": 9}), _decision(40))[0] == 40
    assert engine_settings(_parsed(7), _decision(40), "none")[0] is None


def test_max_tokens_per_model_within_the_clamp() -> None:
    assert engine_settings(_parsed(model_max_tokens={"big": 64}), _decision(1, 32))[1] == 32
    assert engine_settings(_parsed(model_max_tokens={"big": 16}), _decision(1, 32))[1] == 16
    assert engine_settings(_parsed(model_max_tokens={"big": 16}), _decision(1))[1] == 16
    assert engine_settings(_parsed(), _decision(1))[1] is None
