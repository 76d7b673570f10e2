"""The fault-injection benchmark's classification of what a client got
(``kernels_bench.lab.faults.signals``; the benchmark itself runs real engines:
docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import aiohttp
import pytest

from kernels_bench.lab.faults.signals import _classify, table, transport_outcome

DONE = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
ERROR_EVENT = b'data: {"choices":[]}\n\ndata: {"error":{"message":"engine broke"}}\n\n'


@pytest.mark.parametrize("status, stream, data, outcome", [
    (200, False, json.dumps({"choices": [{"message": {}}]}).encode(), "ok"),
    (200, False, b'{"choices": [', "lost"),
    (200, True, DONE, "ok"),
    (200, True, ERROR_EVENT, "error"),
    (200, True, b'data: {"choices":[]}\n\n', "lost"),
    (503, False, json.dumps({"error": {"message": "no engine"}}).encode(), "error"),
    (502, True, b"<html>bad gateway</html>", "lost"),
])
def test_classify(status: int, stream: bool, data: bytes, outcome: str) -> None:
    assert _classify(status, stream, data)[0] == outcome


def test_table_lists_every_phase() -> None:
    phases = [{"name": name, "outcomes": {"ok": 3, "error": 1, "refused": 0, "cut": 0,
                                          "lost": 0},
               "resent": 1, "resent_unanswered": 4,
               "redispatched": 2.0, "down_after_s": 0.5, "back_after_s": None}
              for name in ("steady", "kill-engine")]
    text = table({"phases": phases})
    assert "| kill-engine | 4 | 3 | 1 | 0 | 0 | 0 | 1 | 4 | 2 | 0.50 s | - |" in text


@pytest.mark.parametrize("exc, outcome", [
    (aiohttp.ClientConnectorError(SimpleNamespace(ssl=None, host="127.0.0.1", port=1),
                                  ConnectionRefusedError(111, "refused")), "refused"),
    (aiohttp.ServerTimeoutError("read"), "lost"),  # a ClientError and a TimeoutError
    (asyncio.TimeoutError(), "lost"),
    (aiohttp.ServerDisconnectedError(), "cut"),
    (aiohttp.ClientPayloadError("cut"), "cut"),
])
def test_transport_outcome(exc: Exception, outcome: str) -> None:
    assert transport_outcome(exc) == outcome  # type: ignore[arg-type]
