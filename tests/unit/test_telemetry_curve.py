"""CURVE on the telemetry plane (engine_ext.curve) over real ZeroMQ sockets on loopback:
the router's subscribers take snapshots from our publisher and KV events from vLLM's own
publisher class when both hold the cluster's keys, and nothing from a publisher without
them or with another keypair. tests/integration/test_engine.py runs it on a real engine."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import zmq

from engine_ext.curve import CurveKeyError, EngineCurve, create, engine_curve, main, \
    router_curve
from engine_ext.telemetry import SchedulerSnapshot, TelemetryPublisher
from router.dispatch.core import RouterCore
from tests.engine_proc import free_port
from tests.remote_cluster import remote_cluster


def _snapshot(engine: str, seq: int, batch: int) -> SchedulerSnapshot:
    return SchedulerSnapshot(engine_id=engine, seq=seq, ts=time.time(), step=seq,
                             batch_size=batch, num_waiting=0, queued_prefill_tokens=0,
                             pending_decode_tokens=0, kv_usage=0.0, num_preemptions=0)


def test_keys_are_made_once_and_private(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    main([str(tmp_path / "k")])
    names = sorted(Path(p).name for p in capsys.readouterr().out.split())
    assert names == ["engines.key", "engines.key_secret", "router.key", "router.key_secret"]
    assert oct(os.stat(tmp_path / "k" / "router.key_secret").st_mode & 0o777) == "0o600"
    with pytest.raises(CurveKeyError, match="keys are never replaced"):
        create(tmp_path / "k")
    eng, rt = engine_curve(tmp_path / "k"), router_curve(tmp_path / "k")
    assert eng.server == rt.public and rt.engines == eng.public
    (tmp_path / "k" / "engines.key_secret").unlink()
    with pytest.raises(CurveKeyError, match="engines.key_secret"):
        engine_curve(tmp_path / "k")
    with pytest.raises(SystemExit, match="error: .*exists"):
        main([str(tmp_path / "k")])


def _core(keys: Path, telemetry: str, kv: str) -> RouterCore:
    return RouterCore(remote_cluster("round_robin", {"e-0": "m"}, max_model_len=1024,
                                     url="http://127.0.0.1:9", endpoints=(telemetry, kv),
                                     heartbeat_timeout_s=60, telemetry_keys_dir=str(keys)))


async def _until(check: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


def test_only_keyed_publishers_reach_the_router(tmp_path: Path) -> None:
    """Our snapshot publisher and vLLM's KV-event publisher (``CurveZmqEventPublisher``)
    with the engines' key are heard; a cleartext one and one with its own keypair send
    batch sizes the router never sees."""
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    from engine_ext.kv_publisher import CurveZmqEventPublisher

    create(tmp_path / "keys")
    other = tmp_path / "other"
    create(other)
    good = engine_curve(tmp_path / "keys")
    stranger = EngineCurve(engine_curve(other).public, engine_curve(other).secret, good.server)
    telemetry = f"tcp://127.0.0.1:{free_port()}"  # the router binds, publishers connect
    kv = f"ipc://{tmp_path}/kv"  # the publisher binds, the router connects

    async def go() -> None:
        core = _core(tmp_path / "keys", telemetry, kv)
        await core.start()
        ctx = zmq.Context()
        pubs = [TelemetryPublisher(telemetry, "e-0", ctx=ctx, curve=curve)
                for curve in (None, stranger, good)]
        kv_pub = CurveZmqEventPublisher(data_parallel_rank=0, endpoint=kv, topic="e-0",
                                        curve=good)
        try:
            await asyncio.sleep(0.5)  # handshakes (the two intruders' fail)
            for seq in range(40):  # PUB drops until connected: keep sending
                pubs[0].publish(_snapshot("e-0", seq, 7))
                pubs[1].publish(_snapshot("e-0", seq, 7))
                pubs[2].publish(_snapshot("e-0", seq, 3))
                kv_pub.publish(KVEventBatch(ts=time.time(), events=[BlockStored(
                    block_hashes=[1234], parent_block_hash=None, token_ids=list(range(16)),
                    block_size=16, lora_id=None, medium="GPU", lora_name=None)]))
                await asyncio.sleep(0.05)
            state = core.state.table["e-0"]
            assert await _until(lambda: state.snapshot is not None)
            assert await _until(lambda: state.kv.match([1234]) == 1)
            seen = core.membership.stats.engines["e-0"]
            assert state.snapshot is not None and state.snapshot.batch_size == 3
            assert seen.snapshot_frames > 0 and core.membership.stats.malformed_snapshot_frames == 0
            # Every frame applied came from the keyed publisher: its own sequence, no
            # out-of-order frames from the others' interleaved numbers.
            assert core.membership.stats.out_of_order_snapshot_frames == 0
        finally:
            kv_pub.shutdown()
            for p in pubs:
                p.close()
            ctx.term()
            await core.stop()
    asyncio.run(go())
