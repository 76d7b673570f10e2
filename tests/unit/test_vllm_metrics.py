"""A stock vLLM engine's ``/metrics`` body as the router reads it: the series, the rules
that refuse a body, totality under fuzzing, and the ledger's estimates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.state.inflight import InflightLedger, InflightRecord
from router.state.vllm_metrics import (MAX_METRICS_BYTES, MAX_SERIES, MetricsError,
                                       VllmMetrics, estimate_tokens, parse_metrics,
                                       stock_snapshot)

REAL = (Path(__file__).parents[1] / "fixtures" / "vllm_metrics.txt").read_bytes()
"""A real vLLM 0.32 server's /metrics after six requests (3,006 prompt tokens, 120
generated), idle."""
GOOD = (b"vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n"
        b"vllm:kv_cache_usage_perc 0.25\n")


def test_reads_a_real_vllm_body() -> None:
    assert parse_metrics(REAL) == VllmMetrics(running=0, waiting=0, kv_usage=0.0,
                                              preemptions=0, tokens=3006 + 120)


def test_a_busy_body_with_labels_and_data_parallel_cores() -> None:
    body = REAL.replace(b'vllm:num_requests_running{engine="0",model_name="tiny-a"} 0.0',
                        b'vllm:num_requests_running{engine="0",model_name="tiny-a"} 3.0\n'
                        b'vllm:num_requests_running{engine="1",model_name="tiny-a"} 2.0')
    body = body.replace(b'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-a"} 0.0',
                        b'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-a"} 0.5\n'
                        b'vllm:kv_cache_usage_perc{engine="1",model_name="t}a"} 0.75 17')
    m = parse_metrics(body)
    assert (m.running, m.kv_usage) == (5, 0.75)  # summed; the largest fraction


@pytest.mark.parametrize("body, error", [
    (b"", "no vllm:num_requests_running"),
    (b"<html>not metrics</html>", "is this a vLLM server"),
    (GOOD.replace(b"0.25", b"NaN"), "not finite"),
    (GOOD.replace(b"0.25", b"1.5"), "not a fraction"),
    (GOOD.replace(b"running 1", b"running -1"), "not finite and >= 0"),
    (GOOD.replace(b"running 1", b"running +Inf"), "not finite"),
    (GOOD.replace(b"waiting 2", b"waiting two"), "is not a number"),
    (GOOD + b"vllm:num_requests_running 1\n" * MAX_SERIES, f"over {MAX_SERIES} series"),
    (GOOD + b"#" * MAX_METRICS_BYTES, "over 4194304"),
])
def test_refuses_an_unusable_body(body: bytes, error: str) -> None:
    with pytest.raises(MetricsError, match=error):
        parse_metrics(body)


def test_a_series_split_by_a_newline_in_a_label_is_not_read() -> None:
    body = GOOD.replace(b"vllm:num_requests_running 1",
                        b'vllm:num_requests_running{a="x\n"} 7')
    with pytest.raises(MetricsError, match="no vllm:num_requests_running"):
        parse_metrics(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096) | st.lists(
    st.sampled_from([b"vllm:num_requests_running", b"vllm:num_requests_waiting",
                     b"vllm:kv_cache_usage_perc", b"{", b"}", b'"', b"\\", b" ", b"\n",
                     b"1", b"0.5", b"-", b"nan", b"e9", b'engine="0"', b"\x00", b"\xff"]),
    max_size=200).map(b"".join))
def test_any_body_parses_or_fails_with_metrics_error(body: bytes) -> None:
    try:
        m = parse_metrics(body)
    except MetricsError:
        return
    assert m.running >= 0 and m.waiting >= 0 and 0.0 <= m.kv_usage <= 1.0


def _ledger(*prompts: int) -> InflightLedger:
    ledger = InflightLedger()
    for i, p in enumerate(prompts):
        ledger.add(InflightRecord(f"r{i}", "e", "m", predicted_tokens=0.0, prefill_tokens=p,
                                  decode_tokens=100 + i, sent_wall=float(i)))
    return ledger


def test_estimates_take_the_newest_requests_as_the_waiting_ones() -> None:
    load = _ledger(10, 20, 30).load("e")
    assert estimate_tokens(load, waiting=2) == (20 + 30, 100 + 101 + 102)
    assert estimate_tokens(load, waiting=0) == (0, 303)
    assert estimate_tokens(load, waiting=9) == (60, 303)  # other clients' requests too
    assert estimate_tokens(_ledger().load("e"), waiting=4) == (0, 0)


def test_stock_snapshot_counts_are_measured_and_sums_estimated() -> None:
    m = VllmMetrics(running=1, waiting=1, kv_usage=0.5, preemptions=3, tokens=999)
    snap = stock_snapshot("e", 7, 12.5, m, _ledger(10, 20).load("e"))
    assert (snap.engine_id, snap.seq, snap.ts, snap.step) == ("e", 7, 12.5, 999)
    assert (snap.batch_size, snap.num_waiting, snap.kv_usage, snap.num_preemptions) == \
        (1, 1, 0.5, 3)
    assert (snap.queued_prefill_tokens, snap.pending_decode_tokens) == (20, 201)
