"""Engine table through the facade: snapshots, staleness, gaps, malformed frames,
explicit marks, and the router's own in-flight accounting."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import msgspec
import pytest

from engine_ext.telemetry import (BlockStored, FinishedRequest, KVEventBatch,
                                  SchedulerSnapshot, encode_snapshot)
from router.dispatch.core import RouterCore
from router.types import NoEngineAvailable, RoutingRequest
from tests.remote_cluster import remote_cluster


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_core(policy: str = "round_robin", engines: dict[str, str] | None = None,
              **router: Any) -> tuple[RouterCore, Clock]:
    cfg = remote_cluster(policy, engines or {"e0": "a", "e1": "a"}, max_model_len=1024,
                         heartbeat_timeout_s=2.0, **router)
    clock = Clock()
    core = RouterCore(cfg, clock=clock, wall_clock=clock)
    core.build_policy()
    return core, clock


def snap_frames(engine: str, seq: int, ts: float = 0.0, **fields: Any) -> list[bytes]:
    snap = SchedulerSnapshot(engine_id=fields.pop("engine_id", engine), seq=seq, ts=ts,
                             step=fields.pop("step", seq),
                             batch_size=fields.pop("batch_size", 0),
                             num_waiting=fields.pop("num_waiting", 0), queued_prefill_tokens=0,
                             pending_decode_tokens=fields.pop("pending_decode_tokens", 0),
                             kv_usage=0.0, num_preemptions=0, **fields)
    return [engine.encode(), seq.to_bytes(8, "big", signed=True), encode_snapshot(snap)]


def kv_frames(engine: str, seq: int, hashes: list[int]) -> list[bytes]:
    stored = BlockStored(block_hashes=list[int | bytes](hashes), parent_block_hash=None,
                         token_ids=[], block_size=4)
    batch = KVEventBatch(ts=0.0, events=[stored])
    return [engine.encode(), seq.to_bytes(8, "big", signed=True), msgspec.msgpack.encode(batch)]


def route(core: RouterCore, rid: str = "r", model: str | None = None, **kw: Any) -> Any:
    return asyncio.run(core.routing.route(RoutingRequest(request_id=rid, requested_model=model,
                                                 num_prompt_tokens=10, **kw)))


def view(core: RouterCore, name: str) -> Any:
    return next(v for v in core.membership.engines() if v.name == name)


def test_snapshot_fills_the_table() -> None:
    core, clock = make_core()
    core.membership.snapshots.feed(snap_frames("e0", 0, batch_size=3, pending_decode_tokens=40))
    clock.t += 0.5
    v = view(core, "e0")
    assert (v.up, v.batch_size, v.pending_decode_tokens, v.last_seen_age_s) == (True, 3, 40, 0.5)
    assert view(core, "e1").last_seen_age_s is None  # never seen: up, no telemetry yet
    assert core.membership.stats.engines["e0"].snapshot_frames == 1


def test_stale_engine_goes_down_receives_nothing_and_comes_back() -> None:
    core, clock = make_core()
    core.membership.snapshots.feed(snap_frames("e0", 0))
    core.membership.snapshots.feed(snap_frames("e1", 0))
    clock.t += 2.0
    assert view(core, "e0").up  # exactly the timeout: still up
    clock.t += 0.01
    core.membership.snapshots.feed(snap_frames("e1", 1))
    assert not view(core, "e0").up and "no telemetry for 2.0 s" in view(core, "e0").down_reason
    assert {route(core, f"r{i}").instance for i in range(4)} == {"e1"}
    core.membership.snapshots.feed(snap_frames("e0", 1))
    assert view(core, "e0").up
    assert core.membership.stats.engine_down_events == 1


def test_a_models_last_live_engine_gets_the_sole_engine_timeout() -> None:
    """Silent past the heartbeat timeout with no other engine of its model live (the other
    marked down, or silent too: a router loop that fell behind), an engine stays up until
    ``sole_engine_timeout_s``; with a live peer it goes down at the heartbeat timeout."""
    core, clock = make_core(sole_engine_timeout_s=5.0)
    core.membership.snapshots.feed(snap_frames("e0", 0))
    core.membership.snapshots.feed(snap_frames("e1", 0))
    clock.t += 3.0  # both silent: neither could replace the other
    assert view(core, "e0").up and view(core, "e1").up
    core.membership.mark_engine("e1", False, "restarting")
    clock.t += 2.0  # 5.0 s: exactly the sole timeout
    assert view(core, "e0").up and route(core).instance == "e0"
    clock.t += 0.01
    e0 = view(core, "e0")
    assert not e0.up and "no telemetry for 5.0 s (sole engine timeout 5 s)" in e0.down_reason
    core.membership.snapshots.feed(snap_frames("e0", 1))
    core.membership.mark_engine("e1", True, "")
    core.membership.snapshots.feed(snap_frames("e1", 1))
    clock.t += 2.1
    core.membership.snapshots.feed(snap_frames("e1", 2))  # e1 live: e0 has a replacement
    e0 = view(core, "e0")
    assert not e0.up and "(heartbeat timeout 2 s)" in e0.down_reason


def test_a_stalled_scheduler_is_down_until_its_step_moves() -> None:
    core, clock = make_core(scheduler_stall_timeout_s=5.0)
    core.membership.snapshots.feed(snap_frames("e0", 0, step=7, batch_size=2))
    for seq in range(1, 6):  # heartbeats from the sender thread: same step, work running
        clock.t += 1.0
        core.membership.snapshots.feed(snap_frames("e0", seq, step=7, batch_size=2, heartbeat=True))
    assert view(core, "e0").up  # exactly the timeout
    clock.t += 1.0
    core.membership.snapshots.feed(snap_frames("e0", 6, step=7, batch_size=2, heartbeat=True))
    e0 = view(core, "e0")
    assert not e0.up and "scheduler stalled: step 7 for 6.0 s with 2 running" in e0.down_reason
    assert core.membership.stats.engine_down_events == 1
    assert {route(core, f"r{i}").instance for i in range(4)} == {"e1"}
    core.membership.snapshots.feed(snap_frames("e0", 7, step=8, batch_size=2))
    assert view(core, "e0").up  # the step moved
    clock.t += 60.0  # an idle engine's step stays put: not a stall
    core.membership.snapshots.feed(snap_frames("e1", 0, step=3))
    clock.t += 60.0
    core.membership.snapshots.feed(snap_frames("e1", 1, step=3, heartbeat=True))
    assert view(core, "e1").up


def test_all_engines_down_is_no_engine_available() -> None:
    core, clock = make_core()
    core.membership.mark_engine("e0", False, "connection refused")
    core.membership.mark_engine("e1", False, "timeout")
    with pytest.raises(NoEngineAvailable, match="e0: marked down: connection refused"):
        route(core)


def test_sequence_gaps_are_counted() -> None:
    core, _ = make_core()
    for seq in (0, 1, 4, 5, 9):
        core.membership.snapshots.feed(snap_frames("e0", seq))
    core.membership.kv_events.feed(kv_frames("e0", 0, [1]))
    core.membership.kv_events.feed(kv_frames("e0", 3, [2]))
    c = core.membership.stats.engines["e0"]
    assert (c.snapshot_frames, c.snapshot_gaps, c.kv_frames, c.kv_gaps) == (5, 5, 2, 2)


@pytest.mark.parametrize("frames", [
    [b"e0"],                                             # wrong part count
    [b"e0", b"\x00" * 7, b"x"],                          # bad sequence field
    [b"e0", (0).to_bytes(8, "big"), b"\xc1garbage"],     # not msgpack
    [b"e0", (0).to_bytes(8, "big"), msgspec.msgpack.encode({"seq": "x"})],  # wrong schema
    [b"\xff\xfe", (0).to_bytes(8, "big"), b""],          # topic not utf-8
])
def test_malformed_frames_are_dropped_and_counted(frames: list[bytes]) -> None:
    core, _ = make_core()
    core.membership.snapshots.feed(frames)
    core.membership.kv_events.feed(frames)
    assert core.membership.stats.malformed_snapshot_frames == 1
    assert core.membership.stats.malformed_kv_frames == 1
    assert view(core, "e0").last_seen_age_s is None


def test_unknown_topics_are_counted_not_applied() -> None:
    core, _ = make_core()
    core.membership.snapshots.feed(snap_frames("zz", 0))
    core.membership.snapshots.feed(snap_frames("e0", 0, engine_id="e1"))  # topic and id disagree
    core.membership.kv_events.feed(kv_frames("zz", 0, [1]))
    assert core.membership.stats.unknown_topic_frames == 3
    assert view(core, "e0").last_seen_age_s is None and view(core, "e1").last_seen_age_s is None


def test_mark_down_is_sticky_until_marked_up() -> None:
    core, _ = make_core()
    core.membership.mark_engine("e0", False, "HTTP 502")
    core.membership.snapshots.feed(snap_frames("e0", 0))  # telemetry alone does not clear a mark
    assert not view(core, "e0").up
    core.membership.mark_engine("e0", True, "launcher: restarted")
    assert view(core, "e0").up and view(core, "e0").last_seen_age_s is None
    with pytest.raises(ValueError, match="unknown instance 'nope'"):
        core.membership.mark_engine("nope", False, "x")


def test_the_time_an_engine_went_down_is_kept_and_exported() -> None:
    # hetserve_engine_down_timestamp_seconds: wall-clock time of the last up -> down,
    # absent before any; a second down mark while down does not move it.
    from prometheus_client import generate_latest

    from router.metrics import RouterMetrics

    core, clock = make_core()  # the router's wall clock is ``clock`` here
    table = core.state.table
    assert table["e0"].down_at is None
    clock.t += 7.0
    core.membership.mark_engine("e0", False, "HTTP 502")
    at = table["e0"].down_at
    assert at == clock.t
    clock.t += 1.0
    core.membership.mark_engine("e0", False, "again")
    assert table["e0"].down_at == at
    text = generate_latest(RouterMetrics(core, "vllm").registry).decode()
    exported = re.search(r'^hetserve_engine_down_timestamp_seconds\{engine="e0",model="a"\} '
                         r'(\S+)$', text, re.MULTILINE)
    assert exported is not None and float(exported.group(1)) == at
    assert 'hetserve_engine_down_timestamp_seconds{engine="e1"' not in text


def test_the_last_snapshots_own_time_and_its_receipt_are_exported() -> None:
    # hetserve_telemetry_{sent,received}_timestamp_seconds: the engine's stamp on its last
    # snapshot and the router's wall clock when it came; absent before the first.
    from prometheus_client import generate_latest

    from router.metrics import RouterMetrics

    core, clock = make_core()  # the router's wall clock is ``clock`` here

    def exported(name: str, engine: str) -> float | None:
        text = generate_latest(RouterMetrics(core, "vllm").registry).decode()
        found = re.search(rf'^hetserve_telemetry_{name}_timestamp_seconds'
                          rf'\{{engine="{engine}",model="a"\}} (\S+)$', text, re.MULTILINE)
        return None if found is None else float(found.group(1))

    assert exported("sent", "e0") is None and exported("received", "e0") is None
    core.membership.snapshots.feed(snap_frames("e0", 0, ts=clock.t - 0.25))
    clock.t += 0.5
    core.membership.snapshots.feed(snap_frames("e0", 1, ts=clock.t - 0.125))
    assert exported("sent", "e0") == clock.t - 0.125 and exported("received", "e0") == clock.t
    assert exported("sent", "e1") is None
    clock.t += 3.0
    route(core)  # e0 goes stale (2 s); what it last said stays
    assert not view(core, "e0").up
    assert exported("received", "e0") == clock.t - 3.0
    core.membership.mark_engine("e0", True, "launcher: restarted")
    assert exported("sent", "e0") is None and exported("received", "e0") is None


def test_a_silent_engine_goes_down_with_no_request_to_notice_it() -> None:
    # The sweep of a started router applies the heartbeat timeout by itself: no decision,
    # no /metrics or /health call in between (a worker whose clients all wait on that
    # engine). Real clock and loop.
    cfg = remote_cluster("round_robin", {"e0": "a", "e1": "a"}, max_model_len=1024,
                         heartbeat_timeout_s=0.2)

    async def run() -> tuple[str | None, str | None, int]:
        core = RouterCore(cfg)
        await core.start()
        try:
            for name in ("e0", "e1"):
                core.membership.snapshots.feed(snap_frames(name, 0, ts=time.time()))
            for seq in range(1, 9):  # e1 goes on talking, e0 falls silent
                await asyncio.sleep(0.05)
                core.membership.snapshots.feed(snap_frames("e1", seq, ts=time.time()))
            table = core.state.table
            return table["e0"].down_reason, table["e1"].down_reason, \
                core.state.stats.engine_down_events
        finally:
            await core.stop()

    e0, e1, events = asyncio.run(run())
    assert e0 is not None and "heartbeat timeout 0.2 s" in e0 and e1 is None and events == 1


def test_engine_down_releases_inflight_and_clears_its_kv_index() -> None:
    core, _ = make_core()
    core.membership.kv_events.feed(kv_frames("e0", 0, [1, 2]))
    d = route(core, "r1", max_tokens=20)
    assert d.instance == "e0" and view(core, "e0").inflight_requests == 1
    core.membership.mark_engine("e0", False, "killed")
    v = view(core, "e0")
    assert (v.inflight_requests, v.unreported_requests, len(core.state.table["e0"].kv)) == (0, 0, 0)
    core.routing.on_complete(d, None, "upstream error")  # the later error is a no-op for accounting
    assert len(core.state.ledger) == 0


def test_unreported_requests_count_until_a_later_snapshot() -> None:
    core, clock = make_core()
    core.membership.snapshots.feed(snap_frames("e0", 0, ts=clock.t, batch_size=1))
    core.membership.snapshots.feed(snap_frames("e1", 0, ts=clock.t, batch_size=5))
    clock.t += 0.01
    d = route(core, "r1", max_tokens=20)
    v = view(core, "e0")
    assert (v.unreported_requests, v.unreported_prefill_tokens, v.unreported_decode_tokens,
            v.waiting, v.requests) == (1, 10, 20, 1, 2)
    core.membership.snapshots.feed(snap_frames("e0", 1, ts=clock.t - 0.005, batch_size=1))  # older
    assert view(core, "e0").unreported_requests == 1
    core.membership.snapshots.feed(snap_frames("e0", 2, ts=clock.t + 0.001, batch_size=2))
    v = view(core, "e0")
    assert (v.unreported_requests, v.inflight_requests, v.requests) == (0, 1, 2)
    assert d.instance == "e0"


def test_engine_reported_finish_releases_inflight() -> None:
    core, clock = make_core()
    d = route(core, "abc", max_tokens=5)
    finished = [FinishedRequest("chatcmpl-abc-0123abcd", 5, "stop")]
    core.membership.snapshots.feed(snap_frames(d.instance, 0, ts=clock.t, finished=finished))
    assert view(core, d.instance).inflight_requests == 0 and len(core.state.ledger) == 0


def test_requests_no_engine_can_take_are_value_errors() -> None:
    core, _ = make_core()
    with pytest.raises(ValueError, match="model 'zz' is not served here; served models: a"):
        route(core, model="zz")
    with pytest.raises(ValueError, match="exceed the context of every engine of a"):
        route(core, model="a", max_tokens=1015)
    assert route(core, model="a", max_tokens=1014).model == "a"


def test_restarted_kv_publisher_clears_the_index() -> None:
    core, _ = make_core()
    core.membership.kv_events.feed(kv_frames("e0", 7, [1]))
    core.membership.kv_events.feed(kv_frames("e0", 0, [2]))  # sequence went back: a new process
    kv = core.state.table["e0"].kv
    assert 1 not in kv and 2 in kv
