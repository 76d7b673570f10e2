"""``kernels_bench.lab.studies.small_confidence`` on a real engine: the log-probabilities it
recomputes for a recorded output (the chat template through ``/tokenize``, then
``prompt_logprobs``) are the ones the engine returned when it generated that output greedily
with ``logprobs`` on the call: the offline signal is the one a live agent would read. The
engine is ``a`` of tests/tiny_pair.py."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from kernels_bench.lab.studies import small_confidence as conf
from tests.tiny_pair import MAX_MODEL_LEN, TinyPair

pytestmark = pytest.mark.engine


def test_recomputed_logprobs_are_the_live_calls(tiny_pair: TinyPair) -> None:
    tiny_pair.revive()
    url = tiny_pair.url("a")
    messages = [{"role": "system", "content": "You are the Solver of a math team."},
                {"role": "user", "content": "What is 12 times 7? End with `Answer: <n>`."}]
    with httpx.Client(timeout=120) as client:
        r = client.post(f"{url}/v1/chat/completions", json={
            "model": "tiny-a", "messages": messages, "max_tokens": 24, "temperature": 0.0,
            "logprobs": True, "ignore_eos": True})
        r.raise_for_status()
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        live = [t["logprob"] for t in choice["logprobs"]["content"]]
        got = conf.output_logprobs(client, url, "tiny-a", messages, text, MAX_MODEL_LEN)
        too_long = conf.output_logprobs(client, url, "tiny-a", messages, text, 8)
        empty = conf.output_logprobs(client, url, "tiny-a", messages, "", MAX_MODEL_LEN)
    assert len(live) == 24 and text
    assert got == pytest.approx(live, abs=1e-3)
    assert "max_model_len 8" in too_long and empty == "empty output"
    stats = conf.token_stats(got)
    assert stats["tokens"] == 24
    assert stats["mean"] == pytest.approx(np.mean(live), abs=1e-3)
    assert stats["min"] <= stats["p5"] <= stats["p10"] <= stats["p50"] <= 0
    assert stats["tail"] == pytest.approx(np.mean(live[-conf.TAIL:]), abs=1e-3)
