"""The twin's telemetry is the engine's: snapshots and vLLM's KV events as wire frames the
router's decoders read, on the virtual clock, with the prompts' real block hashes."""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from engine_ext.telemetry import (BlockStored, SchedulerSnapshot,
                                  kv_event_decoder, snapshot_decoder)
from kernels_bench.lab.twin.sim import Simulator
from kernels_bench.lab.twin.speed import synthetic_workload
from kernels_bench.lab.twin.step_time import StepTimeModel
from router.state.kv_hash import BlockHasher
from router.state.kv_index import KVPrefixIndex
from tests.lab.twin_helpers import flat_spec, write_profile


def test_snapshots_and_kv_events_decode_and_index(tmp_path: Path) -> None:
    model = StepTimeModel(write_profile(tmp_path / "e.json",
                                        [(1, 128, 5.0, 4.0, 6.0), (8, 128, 9.0, 8.0, 11.0)],
                                        prefill_ms_per_token=0.05))
    sim = Simulator()
    names = ["e-0", "e-1"]
    for name in names:
        sim.add_engine(flat_spec(name, "stjf", max_num_batched_tokens=512, num_blocks=2000),
                       model, telemetry=True, telemetry_interval_s=0.02)
    snap_frames: list[list[bytes]] = []
    kv_frames: list[list[bytes]] = []
    sim.on_telemetry(lambda twin, s, k: (snap_frames.extend(map(list, s)),
                                         kv_frames.extend(map(list, k))))
    requests = synthetic_workload(seed=3, n=40, engines=names)
    for at, engine, request in requests:
        sim.submit(engine, request, at)
    sim.run()

    snaps_dec, kv_dec = snapshot_decoder(names), kv_event_decoder(names)
    snaps: dict[str, list[SchedulerSnapshot]] = {n: [] for n in names}
    for f in snap_frames:
        got = snaps_dec.decode(f)
        assert got is not None, snaps_dec.last_error
        snaps[got[0]].append(got[2])
    index = {n: KVPrefixIndex() for n in names}
    stored = 0
    for f in kv_frames:
        got = kv_dec.decode(f)
        assert got is not None, kv_dec.last_error
        for event in got[2].events:
            index[got[0]].apply(event)
            stored += isinstance(event, BlockStored)
    assert snaps_dec.malformed == kv_dec.malformed == 0 and stored > 0
    assert all(s.gaps == 0 for s in [*snaps_dec.stats.values(), *kv_dec.stats.values()])

    for name in names:
        seq = snaps[name]
        assert seq[0].ts == 0.0 and seq[0].batch_size == 0  # the idle announcement
        ts = [s.ts for s in seq]
        assert ts == sorted(ts) and ts[-1] <= sim.now()
        # the rate limit on the virtual clock: a busy engine's snapshots 20 ms apart
        assert all(b.ts - a.ts >= 0.02 - 1e-12 for a, b in pairwise(seq)
                   if b.batch_size or b.num_waiting)
        last = seq[-1]
        assert (last.batch_size, last.num_waiting, last.queued_prefill_tokens,
                last.pending_decode_tokens, last.kv_usage) == (0, 0, 0, 0, 0.0)
        assert max(s.batch_size for s in seq) > 1
        finished = {f.request_id: f.output_tokens for s in seq for f in s.finished}
        assert finished == {r.request_id: r.output_tokens
                            for _, e, r in requests if e == name}

    hasher = BlockHasher(none_hash_seed=os.environ.get("PYTHONHASHSEED"))
    for _, engine, request in requests:
        hashes = hasher.block_hashes(request.prompt_token_ids, 16)
        assert index[engine].match(hashes) == len(hashes)  # room for every prompt: nothing evicted
    other = hasher.block_hashes(tuple(range(5000, 5100)), 16)
    assert all(index[n].match(other) == 0 for n in names)
