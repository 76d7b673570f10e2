"""Telemetry schema, publisher thread and decoders over real ZeroMQ sockets (no engine)."""

import time

import msgspec
import pytest
import zmq

from engine_ext.telemetry import (
    SCHEMA_VERSION,
    SERVER_PID_ENV,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    SchedulerSnapshot,
    TelemetryPublisher,
    is_loopback_endpoint,
    kv_event_decoder,
    publisher_binds,
    snapshot_decoder,
    subscriber_binds,
)


def snap(seq: int, **kw) -> SchedulerSnapshot:
    base = dict(engine_id="e", seq=seq, ts=time.time(), step=seq, batch_size=1, num_waiting=0,
                queued_prefill_tokens=0, pending_decode_tokens=0, kv_usage=0.0,
                num_preemptions=0)
    return SchedulerSnapshot(**(base | kw))


def frames(s: SchedulerSnapshot) -> list[bytes]:
    return [b"e", s.seq.to_bytes(8, "big"), msgspec.msgpack.encode(s)]


def test_endpoint_conventions():
    assert publisher_binds("ipc:///tmp/x") and not subscriber_binds("ipc:///tmp/x")
    assert not publisher_binds("tcp://127.0.0.1:5000") and subscriber_binds("tcp://127.0.0.1:5000")
    assert is_loopback_endpoint("tcp://127.0.0.1:1") and is_loopback_endpoint("ipc:///a")
    assert not is_loopback_endpoint("tcp://*:5557") and not is_loopback_endpoint("tcp://10.0.0.1:1")


def test_decoder_counts_gaps_and_drops_malformed():
    d = snapshot_decoder()
    assert d.decode(frames(snap(0)))[2].seq == 0
    assert d.decode(frames(snap(3)))[1] == 3
    assert d.stats["e"].gaps == 2
    bad = [
        [b"e", b"\x00" * 8],                                   # wrong part count
        [b"e", b"\x00" * 4, b"x"],                             # short sequence field
        [b"e", b"\x00" * 8, b"\xc1garbage"],                   # not msgpack
        [b"e", b"\x00" * 8, msgspec.msgpack.encode({"seq": "x"})],  # wrong schema
        [b"e", b"\x00" * 8, msgspec.msgpack.encode(snap(1, version=SCHEMA_VERSION + 1))],
        [b"\xff\xfe", b"\x00" * 8, msgspec.msgpack.encode(snap(1))],  # topic not utf-8
    ]
    for f in bad:
        assert d.decode(f) is None
    assert d.malformed == len(bad)


def test_kv_decoder_reads_vllm_shaped_batches():
    # vLLM encodes KVEventBatch array-like with tagged events; this mirrors its layout.
    batch = KVEventBatch(ts=1.0, events=[
        BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=list(range(256)),
                    block_size=128, lora_id=None, medium="GPU", lora_name=None),
        BlockRemoved(block_hashes=[1], medium="GPU"),
    ])
    payload = msgspec.msgpack.encode(batch)
    assert isinstance(msgspec.msgpack.decode(payload), list)  # array-like on the wire
    topic, seq, got = kv_event_decoder().decode([b"e", (7).to_bytes(8, "big"), payload])
    assert (topic, seq) == ("e", 7)
    assert isinstance(got.events[0], BlockStored) and got.events[0].block_hashes == [1, 2]
    assert isinstance(got.events[1], BlockRemoved)


def test_kv_decoder_matches_vllm_encoding():
    kv = pytest.importorskip("vllm.distributed.kv_events")
    batch = kv.KVEventBatch(ts=2.0, events=[
        kv.BlockStored(block_hashes=[11, 12], parent_block_hash=10, token_ids=[1, 2, 3],
                       block_size=128, lora_id=None, medium="GPU", lora_name=None),
        kv.BlockRemoved(block_hashes=[11], medium="GPU"),
        kv.AllBlocksCleared(),
    ])
    payload = msgspec.msgpack.Encoder().encode(batch)
    got = kv_event_decoder().decode([b"e", (0).to_bytes(8, "big"), payload])[2]
    assert [type(e).__name__ for e in got.events] == ["BlockStored", "BlockRemoved",
                                                      "AllBlocksCleared"]
    assert got.events[0].parent_block_hash == 10 and got.events[0].token_ids == [1, 2, 3]


def _sub(endpoint: str) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 3000)
    (sock.bind if subscriber_binds(endpoint) else sock.connect)(endpoint)
    return ctx, sock


def _recv(sock: zmq.Socket, timeout_s: float) -> list[bytes]:
    if not sock.poll(int(timeout_s * 1000)):
        raise TimeoutError
    return sock.recv_multipart()


@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_publisher_sends_frames_and_idle_heartbeats(tmp_path, kind):
    if kind == "ipc":  # the publisher binds, the subscriber connects
        endpoint = f"ipc://{tmp_path}/t.sock"
        pub = TelemetryPublisher(endpoint, "e", interval_s=0.0, heartbeat_s=0.2)
        ctx, sock = _sub(endpoint)
    else:  # the subscriber binds (the router's side), the publisher connects
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.RCVTIMEO, 3000)
        endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
        pub = TelemetryPublisher(endpoint, "e", interval_s=0.0, heartbeat_s=0.2)
    d = snapshot_decoder()
    try:
        # PUB drops frames until the connection is up (ZeroMQ's slow joiner): publish
        # until one arrives, then the idle heartbeats must follow with no gap.
        first = None
        for _ in range(20):
            pub.publish(snap(pub.next_seq(), batch_size=3))
            deadline = time.monotonic() + 0.5
            while first is None and time.monotonic() < deadline:
                try:
                    got = d.decode(_recv(sock, 0.1))[2]
                except TimeoutError:
                    continue
                first = None if got.heartbeat else got
            if first is not None:
                break
        assert first is not None and first.batch_size == 3 and not first.heartbeat
        beats = [d.decode(_recv(sock, 3.0))[2] for _ in range(2)]
        assert all(b.heartbeat and b.batch_size == 3 for b in beats)
        assert [b.seq for b in beats] == [first.seq + 1, first.seq + 2]
    finally:
        pub.close()
        sock.close(linger=0)
        ctx.term()


def test_rate_limit():
    pub = TelemetryPublisher("inproc://rate", "e", interval_s=10.0)
    try:
        assert pub.due()
        pub.publish(snap(pub.next_seq()))
        assert not pub.due()
    finally:
        pub.close()



_SERVER = """
import os, subprocess, sys, time
if sys.argv[3] == "watched":  # as engine_ext.serve does
    os.environ["HETSERVE_SERVER_PID"] = str(os.getpid())
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
time.sleep(60)
"""
_CORE = """
import sys, time
from engine_ext.telemetry import SchedulerSnapshot, TelemetryPublisher, server_pid
pub = TelemetryPublisher(sys.argv[1], "e", heartbeat_s=0.1, server_pid=server_pid())
pub.publish(SchedulerSnapshot(engine_id="e", seq=pub.next_seq(), ts=time.time(), step=0,
            batch_size=0, num_waiting=0, queued_prefill_tokens=0, pending_decode_tokens=0,
            kv_usage=0.0, num_preemptions=0))
time.sleep(60)
"""


def _frames_after_the_server_dies(tmp_path, mode: str) -> int:
    """Heartbeats a "core" sent in 1 s after its "server" was SIGKILLed (it lives on)."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    endpoint = f"ipc://{tmp_path}/{mode}.sock"
    ctx, sock = _sub(endpoint)
    env = {k: v for k, v in os.environ.items() if k != SERVER_PID_ENV}
    server = subprocess.Popen([sys.executable, "-c", _SERVER, _CORE, endpoint, mode],
                              env=env, start_new_session=True)
    try:
        _recv(sock, 60)  # the core publishes (its heartbeats every 0.1 s)
        core = psutil.Process(server.pid).children()[0]
        server.kill()
        server.wait()
        time.sleep(0.3)  # frames already sent
        while sock.poll(0):
            sock.recv_multipart()
        n, end = 0, time.monotonic() + 1.0
        while (left := end - time.monotonic()) > 0:
            if sock.poll(int(left * 1000)):
                sock.recv_multipart()
                n += 1
        assert core.is_running() and core.status() != psutil.STATUS_ZOMBIE
        return n
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        ctx.destroy(linger=0)


def test_an_orphaned_engine_core_falls_silent(tmp_path):
    # A process tree like vLLM's: a server whose child (the engine core) publishes. A
    # killed server leaves the core alive; told the server's pid (HETSERVE_SERVER_PID,
    # set by engine_ext.serve) it then sends nothing, so the router's heartbeat timeout
    # routes around the engine. Without it, its heartbeats go on.
    assert _frames_after_the_server_dies(tmp_path, "unwatched") >= 5
    assert _frames_after_the_server_dies(tmp_path, "watched") == 0
