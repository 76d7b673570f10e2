"""The telemetry plane survives garbage: a total decoder, bounded schemas, the sequence rule
(resyncs, no lock-out, the KV index rule), guarded state updates with rate-limited logs,
and a small seed-fixed run of ``python -m kernels_bench fuzz-telemetry``."""

from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from engine_ext.telemetry import (MAX_SEQ_JUMP, BlockStored, KVEventBatch, StreamStats,
                                  kv_event_decoder, snapshot_decoder)
from kernels_bench.lab.faults import telemetry_fuzz
from router.dispatch import subscriber
from router.dispatch.subscriber import StreamSubscriber
from router.metrics import RouterMetrics
from tests.unit.test_state_engines import kv_frames, make_core, snap_frames, view

MAX_SEQ = 2**63 - 1


def seq_b(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


# ---- the decoder is total ----

PARTS = st.lists(st.binary(max_size=64), max_size=5)
WELL_FRAMED = st.tuples(st.sampled_from([b"e0", b"e", b"\xff"]),
                        st.integers(-(2**63), MAX_SEQ).map(seq_b),
                        st.binary(max_size=300)).map(list)
VALID_SNAPSHOT = snap_frames("e0", 3, batch_size=2)[2]
VALID_KV = kv_frames("e0", 3, [1, 2])[2]


def overwrite(payload: bytes, edits: list[tuple[int, int]]) -> bytes:
    data = bytearray(payload)
    for i, value in edits:
        data[i] = value
    return bytes(data)


def mutated(payload: bytes) -> st.SearchStrategy[list[bytes]]:
    """A valid payload truncated, extended, or with bytes overwritten."""
    edits = st.lists(st.tuples(st.integers(0, len(payload) - 1), st.integers(0, 255)),
                     min_size=1, max_size=6)
    flipped = edits.map(lambda ed: overwrite(payload, ed))
    cut = st.integers(0, len(payload) - 1).map(lambda n: payload[:n])
    grown = st.binary(min_size=1, max_size=32).map(lambda tail: payload + tail)
    return st.tuples(st.integers(0, 2**40), st.one_of(flipped, cut, grown)).map(
        lambda sp: [b"e0", seq_b(sp[0]), sp[1]])


@settings(max_examples=500, deadline=None)
@given(st.one_of(PARTS, WELL_FRAMED, mutated(VALID_SNAPSHOT), mutated(VALID_KV)))
def test_decode_is_total(frames: list[bytes]) -> None:
    for decoder in (snapshot_decoder(), kv_event_decoder({"e0"})):
        got = decoder.decode(frames)
        assert got is None or (isinstance(got, tuple) and len(got) == 3)


def deep_kv(depth: int) -> bytes:
    """A KV batch whose ``extra_keys`` (typed Any: msgspec recurses) nests ``depth`` deep."""
    return msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=[BlockStored(
        block_hashes=[1], parent_block_hash=None, token_ids=[], block_size=4,
        extra_keys=["@"])])).replace(msgspec.msgpack.encode("@"), b"\x91" * depth + b"\xc0")


FEED_CORE = make_core()[0]


@settings(max_examples=500, deadline=None)
@given(st.one_of(WELL_FRAMED, mutated(VALID_SNAPSHOT), mutated(VALID_KV)))
def test_garbage_never_fails_a_state_update(frames: list[bytes]) -> None:
    """Whatever a frame that decodes holds, applying it to router state does not raise."""
    FEED_CORE.membership.snapshots.feed(frames)
    FEED_CORE.membership.kv_events.feed(frames)
    stats = FEED_CORE.membership.stats
    assert stats.failed_snapshot_frames == stats.failed_kv_frames == 0


@pytest.mark.parametrize("depth", [10, 5000, 100_000])
def test_deep_nesting_is_malformed_not_an_exception(depth: int) -> None:
    kv = kv_event_decoder()
    got = kv.decode([b"e0", seq_b(0), deep_kv(depth)])
    assert (got is None) == (depth > 10) and kv.malformed == (depth > 10)
    if depth > 10:
        assert "RecursionError" in str(kv.last_error)
    snap = snapshot_decoder()
    assert snap.decode([b"e0", seq_b(0), b"\x81\xa1k" * depth + b"\xc0"]) is None
    assert snap.malformed == 1


@pytest.mark.parametrize("field,value", [
    ("batch_size", -1), ("num_waiting", 2**64 - 1), ("queued_prefill_tokens", 2**53 + 1),
    ("kv_usage", math.nan), ("kv_usage", 1.5), ("kv_usage", -0.1), ("ts", math.inf),
    ("ts", math.nan), ("ts", -1.0), ("finished", [["r", -1, "stop"]]),
])
def test_absurd_snapshot_values_are_malformed(field: str, value: Any) -> None:
    obj = msgspec.msgpack.decode(VALID_SNAPSHOT)
    obj[field] = value
    d = snapshot_decoder()
    assert d.decode([b"e0", seq_b(0), msgspec.msgpack.encode(obj)]) is None
    assert d.malformed == 1


@pytest.mark.parametrize("block_size", [0, -16])
def test_block_size_must_be_positive(block_size: int) -> None:
    obj = msgspec.msgpack.decode(VALID_KV)
    obj[1][0]["block_size"] = block_size
    d = kv_event_decoder()
    assert d.decode([b"e0", seq_b(0), msgspec.msgpack.encode(obj)]) is None
    assert d.malformed == 1


def test_negative_sequence_numbers_are_malformed() -> None:
    d = snapshot_decoder()
    assert d.decode([b"e0", seq_b(-1), VALID_SNAPSHOT]) is None
    assert d.malformed == 1 and not d.stats


def test_unknown_topics_leave_no_state() -> None:
    d = kv_event_decoder({"e0"})
    for i in range(100):
        assert d.decode([b"zz%d" % i, seq_b(0), VALID_KV]) is None
    assert d.unknown_topic == 100 and not d.stats


# ---- the sequence rule ----

def accepted(seqs: list[int]) -> tuple[list[bool], StreamStats]:
    s = StreamStats()
    return [s.accept(q) for q in seqs], s


@pytest.mark.parametrize("seqs,expect,gaps,resyncs", [
    ([0, 1, 2, 5], [True] * 4, 2, 0),                                  # in order, 2 lost
    ([5, 6, MAX_SEQ, 7, 8], [True, True, False, True, True], 0, 0),     # one spoof
    ([5, 6, 6, 7], [True, True, False, True], 0, 0),                    # duplicate
    ([5, 9, 3, 10], [True, True, False, True], 3, 0),                   # stale
    ([5, 6, 0, 1], [True] * 4, 0, 1),                                   # restart at 0
    ([9, 10, 2, 3, 4], [True, True, False, True, True], 0, 1),          # restart, 0 and 1 lost
    ([1, 2, 2**62, 2**62 + 1, 3, 4],                                    # two consistent spoofs:
     [True, True, False, True, False, True], 0, 2),                     # adopted, then back
    ([1, 2 + MAX_SEQ_JUMP, 3 + MAX_SEQ_JUMP], [True, False, True], 0, 1),  # far jump
    ([1, 1 + MAX_SEQ_JUMP], [True, True], MAX_SEQ_JUMP - 1, 0),         # the largest gap
    ([0, 0, 1], [True, False, True], 0, 0),                             # duplicate 0
])
def test_sequence_rule(seqs: list[int], expect: list[bool], gaps: int, resyncs: int) -> None:
    got, s = accepted(seqs)
    assert got == expect and (s.gaps, s.resyncs) == (gaps, resyncs)
    assert s.out_of_order == expect.count(False)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2**40), st.lists(st.integers(0, MAX_SEQ), max_size=4))
def test_a_spoofed_frame_never_locks_out_the_real_stream(real: int, spoofs: list[int]) -> None:
    """After any one spoofed frame the second real frame is taken; the first one too
    unless the spoof was plausible (a restart at 0, or within MAX_SEQ_JUMP ahead)."""
    s = StreamStats()
    assert s.accept(real)
    for spoof in spoofs:
        plausible = spoof == 0 or real < spoof <= real + MAX_SEQ_JUMP
        s.accept(spoof)
        assert s.accept(real + 1) or plausible
        assert s.accept(real + 2)
        real += 2


def test_spoofed_huge_snapshot_seq_does_not_take_the_engine() -> None:
    core, clock = make_core()
    core.membership.snapshots.feed(snap_frames("e0", 5, batch_size=1))
    spoof = snap_frames("e0", 6, batch_size=99)
    spoof[1] = seq_b(MAX_SEQ)  # the frame's sequence number (the payload's is bounded)
    core.membership.snapshots.feed(spoof)
    for seq in (6, 7):
        clock.t += 1.5  # the engine would go stale if real frames were dropped
        core.membership.snapshots.feed(snap_frames("e0", seq, batch_size=seq))
        assert view(core, "e0").up and view(core, "e0").batch_size == seq
    stats = core.membership.stats
    assert stats.out_of_order_snapshot_frames == 1 and stats.engines["e0"].snapshot_resyncs == 0


def test_sender_restart_resyncs_and_the_engine_keeps_reporting() -> None:
    core, clock = make_core()
    for seq in (0, 1, 2):
        core.membership.snapshots.feed(snap_frames("e0", seq, batch_size=1))
    core.membership.snapshots.feed(snap_frames("e0", 0, batch_size=4))  # a new process
    stats = core.membership.stats
    assert view(core, "e0").batch_size == 4 and stats.engines["e0"].snapshot_resyncs == 1
    core.membership.snapshots.feed(snap_frames("e0", 1, batch_size=5))
    assert view(core, "e0").batch_size == 5 and stats.engines["e0"].snapshot_gaps == 0


def test_kv_rule_a_stale_batch_is_dropped_a_step_back_for_good_clears() -> None:
    core, _ = make_core()
    for seq, h in ((10, 1), (11, 2)):
        core.membership.kv_events.feed(kv_frames("e0", seq, [h]))
    events = core.membership.kv_events
    events.feed(kv_frames("e0", 4, [3]))   # stale or duplicate: dropped, index kept
    core.membership.kv_events.feed(kv_frames("e0", 12, [4]))
    kv = core.state.table["e0"].kv
    assert (1 in kv, 2 in kv, 3 in kv, 4 in kv) == (True, True, False, True)
    events.feed(kv_frames("e0", 2, [5]))   # a restart whose frames 0, 1 were lost:
    core.membership.kv_events.feed(kv_frames("e0", 3, [6]))   # confirmed by the next batch
    assert (1 in kv, 4 in kv, 5 in kv, 6 in kv) == (False, False, False, True)
    core.membership.kv_events.feed(kv_frames("e0", 4 + MAX_SEQ_JUMP, [7]))  # a far jump forward,
    core.membership.kv_events.feed(kv_frames("e0", 5 + MAX_SEQ_JUMP, [8]))  # confirmed: index kept
    assert (6 in kv, 7 in kv, 8 in kv) == (True, False, True)
    stats = core.membership.stats
    assert stats.engines["e0"].kv_resyncs == 2 and stats.out_of_order_kv_frames == 3


# ---- the subscriber: guarded updates, rate-limited logs, metrics ----

def test_failed_updates_and_malformed_frames_are_counted_and_logged_rate_limited(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(subscriber, "time", SimpleNamespace(monotonic=lambda: now[0]))
    calls: list[int] = []

    def handle(topic: str, seq: int, obj: Any) -> None:
        calls.append(seq)
        raise KeyError(topic)

    sub = StreamSubscriber("snapshot", [], snapshot_decoder(), handle)
    with caplog.at_level(logging.WARNING, logger="hetserve.router"):
        for seq in range(50):
            sub.feed(snap_frames("e0", seq))
            sub.feed([b"garbage"])
        now[0] += subscriber.LOG_INTERVAL_S
        sub.feed(snap_frames("e0", 50))
    assert calls == list(range(51)) and sub.errors == 51 and sub.decoder.malformed == 50
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("snapshot telemetry: state update failed: 1 since the last "
                               "report (latest: KeyError: 'e0')")
    assert lines[1].startswith("snapshot telemetry: malformed frames: 1 since")
    assert lines[2].startswith("snapshot telemetry: state update failed: 50 since")
    assert caplog.records[0].exc_info is not None  # with the traceback


def test_a_receive_loop_outlives_garbage_and_failing_updates(tmp_path: Any) -> None:
    endpoint = f"ipc://{tmp_path}/s"
    seen: list[int] = []

    def handle(topic: str, seq: int, obj: Any) -> None:
        if seq % 2:
            raise RuntimeError("update failed")
        seen.append(seq)

    async def scenario() -> StreamSubscriber:
        ctx = zmq.asyncio.Context()
        pub_ctx = zmq.Context()
        pub = pub_ctx.socket(zmq.PUB)
        pub.bind(endpoint)
        sub = StreamSubscriber("kv", [endpoint], kv_event_decoder(), handle)
        await sub.start(ctx)
        assert sub.tasks[0].get_name().startswith("sub kv")
        deep = deep_kv(50_000)
        try:
            seq = 0
            while not seen and seq < 2000:  # until the connection is up
                pub.send_multipart([b"e0", seq_b(seq), VALID_KV])
                seq += 2
                await asyncio.sleep(0.005)
            start = seq
            for seq in range(start, start + 40):
                pub.send_multipart([b"e0", seq_b(seq), deep])   # malformed
                pub.send_multipart([b"e0", seq_b(seq), VALID_KV])  # odd ones fail
            for _ in range(200):
                if seen[-1] == start + 38:
                    break
                await asyncio.sleep(0.01)
            assert not any(t.done() for t in sub.tasks)
            return sub
        finally:
            await sub.stop()
            pub.close(0)
            pub_ctx.term()
            ctx.term()
    sub = asyncio.run(scenario())
    assert sub.decoder.malformed == 40 and sub.errors == 20


@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_an_oversize_part_costs_the_connection_not_the_stream(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """ZeroMQ drops a connection that sends a part over MAX_MESSAGE_BYTES; it gives an
    endpoint the router connected to (ipc) up for good unless the subscriber reconnects."""
    monkeypatch.setattr(subscriber, "MAX_MESSAGE_BYTES", 1 << 16)
    seen: list[int] = []

    async def scenario() -> None:
        ctx, pub_ctx = zmq.asyncio.Context(), zmq.Context()
        pub = pub_ctx.socket(zmq.PUB)
        if kind == "ipc":  # the publisher binds, the router connects
            endpoint = f"ipc://{tmp_path}/o"
            pub.bind(endpoint)
        else:  # the router binds, the publisher connects
            with zmq.Context() as probe_ctx, probe_ctx.socket(zmq.REP) as probe:
                endpoint = f"tcp://127.0.0.1:{probe.bind_to_random_port('tcp://127.0.0.1')}"
        sub = StreamSubscriber("kv", [endpoint], kv_event_decoder(),
                               lambda topic, seq, obj: seen.append(seq))
        await sub.start(ctx)
        if kind == "tcp":
            pub.connect(endpoint)

        async def deliver(first: int) -> int:
            for seq in range(first, first + 300):
                pub.send_multipart([b"e0", seq_b(seq), VALID_KV])
                await asyncio.sleep(0.01)
                if seen and seen[-1] >= first:
                    return seq
            raise AssertionError(f"nothing from seq {first} on arrived")
        try:
            last = await deliver(0)
            pub.send_multipart([b"e0", seq_b(last + 1), b"\x00" * (1 << 17)])
            await deliver(last + 2)
        finally:
            await sub.stop()
            pub.close(0)
            pub_ctx.term()
            ctx.term()
        assert sub.decoder.malformed == 0  # the oversize part never reached the decoder
    asyncio.run(scenario())


def test_metrics_export_resyncs_and_drop_reasons() -> None:
    core, _ = make_core()
    core.membership.snapshots.feed(snap_frames("e0", 5))
    core.membership.snapshots.feed(snap_frames("e0", 0))
    core.membership.snapshots.feed(snap_frames("e0", 0))  # a duplicate
    text = RouterMetrics(core, "round_robin").render().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("hetserve_telemetry_resyncs_total",
                    (("engine", "e0"), ("stream", "snapshot")))] == 1
    dropped = {labels: v for (name, labels), v in samples.items()
               if name == "hetserve_telemetry_dropped_frames_total"}
    assert dropped[(("reason", "out_of_order"), ("stream", "snapshot"))] == 1
    assert {dict(labels)["reason"] for labels in dropped} == {
        "malformed", "out_of_order", "error", "unknown_topic"}


# ---- the fuzzer, small and seed-fixed ----

def test_fuzz_telemetry_small_run() -> None:
    rep = telemetry_fuzz.run(2000, seed=7)
    failures = [f for p in rep["phases"] for f in p["failures"]]
    assert not failures and rep["ok"]
    assert rep["escaped_exceptions"] == []
    assert rep["sent"]["oversize"] == 4  # one per lane, refused by ZeroMQ
    assert rep["fuzz"]["dropped"] == rep["fuzz"]["garbage"] == 1996
    assert rep["router"]["failed_updates"] == {"snapshot": 0, "kv": 0}
    assert all(lane["resyncs"] == 5 for lane in rep["router"]["lanes"].values())
