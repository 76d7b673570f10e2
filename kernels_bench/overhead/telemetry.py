"""``python -m kernels_bench telemetry``: cost of the engine telemetry stream.

1. Through ``TelemetryPublisher`` (its sender thread, real ZeroMQ sockets) to a decoding
   subscriber, over ``ipc://`` and loopback TCP: publish-to-receive latency (p50, p99)
   at a paced 1,000 snapshots/s (50x the default rate limit), and the sustained rate
   when flooding (where latency is mostly time spent queued).
2. Scheduler step time with telemetry on versus off: vLLM's scheduler with our
   ``TelemetryMixin`` (publishing every step, the worst case, and at the default 20 ms
   rate limit) against the same scheduler without an endpoint, on ``lib.scheduler_harness``
   (no model), ``max_num_seqs`` running and N waiting. Printed as ratios measured in the
   same run, interleaved.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from typing import Any

import zmq

from engine_ext.telemetry import (
    SchedulerSnapshot,
    TelemetryPublisher,
    snapshot_decoder,
    subscriber_binds,
)


def _snapshot(seq: int) -> SchedulerSnapshot:
    return SchedulerSnapshot(engine_id="bench", seq=seq, ts=time.time(), step=seq, batch_size=64,
                             num_waiting=1000, queued_prefill_tokens=12345,
                             pending_decode_tokens=54321, kv_usage=0.5, num_preemptions=0)


def stream(endpoint: str, n: int, rate: float | None) -> dict[str, Any]:
    """Send ``n`` snapshots at ``rate`` per second (None: as fast as the thread takes them)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    if subscriber_binds(endpoint):
        endpoint = f"tcp://127.0.0.1:{sub.bind_to_random_port('tcp://127.0.0.1')}"
    pub = TelemetryPublisher(endpoint, "bench", interval_s=0.0, heartbeat_s=3600, ctx=ctx)
    if not subscriber_binds(endpoint):
        time.sleep(0.1)
        sub.connect(endpoint)
    decoder = snapshot_decoder()
    latencies: list[float] = []
    received = 0
    # Wait for the connection: send probes until one arrives.
    while not sub.poll(100):
        pub.publish(_snapshot(pub.next_seq()))
    sub.recv_multipart()
    while sub.poll(50):
        sub.recv_multipart()
    start_seq = pub.next_seq()
    done = threading.Event()

    def receive() -> None:
        nonlocal received
        while received < n and sub.poll(2000):
            got = decoder.decode(sub.recv_multipart())
            if got is not None and got[1] > start_seq:
                latencies.append(time.time() - got[2].ts)
                received += 1
        done.set()

    t = threading.Thread(target=receive)
    t.start()
    t0 = time.perf_counter()
    for i in range(n):
        if rate is not None:
            time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
        pub.publish(_snapshot(pub.next_seq()))
        if pub._queue.qsize() > 200:  # stay under the hand-off queue bound: no drops
            time.sleep(0.0005)
    done.wait(30)
    elapsed = time.perf_counter() - t0
    t.join()
    pub.close()
    sub.close(linger=0)
    ctx.term()
    lat = sorted(latencies)
    return {
        "endpoint": endpoint.split(":")[0], "mode": "flood" if rate is None else f"{rate:.0f}/s",
        "sent": n, "received": received,
        "per_second": received / elapsed,
        "p50_us": lat[len(lat) // 2] * 1e6 if lat else None,
        "p99_us": lat[int(0.99 * (len(lat) - 1))] * 1e6 if lat else None,
    }


def step_overhead(n_waiting: int, steps: int, max_num_seqs: int) -> list[dict[str, Any]]:
    """schedule()+update_from_output() time with telemetry off, every step, and rate-limited."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from engine_ext.instrumented import TelemetryMixin
    from kernels_bench.lib.scheduler_harness import fake_output, make_request, make_scheduler

    class Instrumented(TelemetryMixin, Scheduler):
        pass

    tmp = tempfile.mkdtemp(prefix="hetserve-telbench-")
    variants = {
        "off": {},
        "every step": {"telemetry_endpoint": f"ipc://{tmp}/a", "telemetry_interval_ms": 0},
        "20 ms": {"telemetry_endpoint": f"ipc://{tmp}/b", "telemetry_interval_ms": 20},
    }
    scheds = {}
    for name, cfg in variants.items():
        s = make_scheduler(Instrumented, policy="priority", max_num_seqs=max_num_seqs,
                           num_blocks=4 * (n_waiting + 4 * max_num_seqs) + 64,
                           hetserve={"engine_id": "bench", **cfg})
        for i in range(max_num_seqs + n_waiting):
            s.add_request(make_request(f"r{i}", max_tokens=10**6, priority=i, arrival_time=i,
                                       first_token=i))
        scheds[name] = s
    samples: dict[str, list[float]] = {name: [] for name in scheds}
    for _ in range(steps):
        for name, s in scheds.items():
            t0 = time.perf_counter()
            out = s.schedule()
            s.update_from_output(out, fake_output(s, out))
            samples[name].append(time.perf_counter() - t0)
    for s in scheds.values():
        s.shutdown()
    base = statistics.median(samples["off"])
    return [{"waiting": n_waiting, "telemetry": name, "median_us": statistics.median(xs) * 1e6,
             "ratio_vs_off": statistics.median(xs) / base} for name, xs in samples.items()]
