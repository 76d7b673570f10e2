"""A real engine (engine_ext.serve on builtin:tiny-a, max_num_seqs=1) end to end:
priority reaches the scheduler, service order follows the key, aging bounds starvation,
telemetry and KV events arrive, bad priorities are rejected without touching the engine.

Queues are built while the engine is paused (vLLM's ``/pause?mode=keep``, dev mode): the
requests reach the scheduler's waiting queue and wait there, however slowly a loaded
machine lets the client and the API server send them, and ``/resume`` starts serving once
the API server has logged each as sent to the engine core (``--enable-log-requests``).
A long request that is already running is no substitute: a busy engine on a 2-core
machine can starve the client until that request has finished.

The engines' command lines are the launcher's (``launcher.planner.make_plan`` on each
engine's cluster file, ``CLUSTERS``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import tomli_w
import zmq

from engine_ext.telemetry import (
    BlockStored,
    SchedulerSnapshot,
    kv_event_decoder,
    snapshot_decoder,
    subscriber_binds,
)
from tests.engine_proc import EngineProc, free_port
from tests.tiny_pair import TINY, TinyPair, plan_engines

pytestmark = pytest.mark.engine

S = 20  # starvation threshold of the test engine
CLUSTERS = {
    "stjf-e2e": ({}, {"max_promotions": 1, "max_model_len": 4096}),
    "stjf-aging": ({"telemetry_interval_ms": 0.001}, {"max_promotions": 3}),
}
"""Each engine's ``[router]`` (its telemetry interval) and ``[[engines]]`` settings beside
the common ones: one slot, STJF with aging, dev mode (``/pause``, ``/resume``) and vLLM's
request log, for ``_queue_while_paused``; ``stjf-aging`` with three promotion levels and a
snapshot every step (its test counts steps; 1 us apart at least, less than any step)."""


def _cluster_file(name: str, port: int) -> dict[str, object]:
    router, engine = CLUSTERS[name]
    return {"router": {"policy": "round_robin", **router}, "engines": [{
        "name": name, "model": "builtin:tiny-a", "served_model_name": "tiny-a", "port": port,
        "max_num_seqs": 1, "starvation_threshold": S, "quantum": 8, **TINY,
        "extra_args": ["--enable-log-requests"], "env": {"VLLM_SERVER_DEV_MODE": "1"},
        **engine}]}


class Collector:
    """Background SUB sockets gathering decoded telemetry and KV-event frames."""

    def __init__(self, engine: EngineProc) -> None:
        self.snapshots: list[SchedulerSnapshot] = []
        self.kv_events: list[object] = []
        self.snap_decoder, self.kv_decoder = snapshot_decoder(), kv_event_decoder()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._socks = []
        for ep in (engine.telemetry_endpoint, engine.kv_events_endpoint):
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            (sock.bind if subscriber_binds(ep) else sock.connect)(ep)
            self._socks.append(sock)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for s in self._socks:
            poller.register(s, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                if sock is self._socks[0]:
                    if (got := self.snap_decoder.decode(frames)) is not None:
                        self.snapshots.append(got[2])
                elif (got := self.kv_decoder.decode(frames)) is not None:
                    self.kv_events.extend(got[2].events)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in self._socks:
            s.close(linger=0)
        self._ctx.term()


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, EngineProc]]:
    """Both test engines (``CLUSTERS``), planned by the launcher on cores 0 and 1 and
    started at once (75 s here, against 93 s one after the other)."""
    d = Path(tempfile.mkdtemp(prefix="hs-stjf-", dir="/tmp"))  # short: ipc paths
    planned: list[TinyPair] = []
    try:
        for core, name in enumerate(CLUSTERS):
            (d / f"{name}.toml").write_text(tomli_w.dumps(_cluster_file(name, free_port())))
            planned.append(plan_engines(d / f"{name}.toml", d / name, [name], [core]))
        for p in planned:
            p.revive(wait=False)
        out = {}
        for p in planned:
            p.revive()
            i = p.instance(p.names[0])
            assert i.telemetry_endpoint and i.kv_events_endpoint
            out[i.engine] = EngineProc(i.name, i.port, p.procs[i.engine], p.log(i.engine),
                                       i.telemetry_endpoint, i.kv_events_endpoint)
        yield out
    finally:
        for p in planned:
            p.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def engine(engines: dict[str, EngineProc]) -> EngineProc:
    return engines["stjf-e2e"]


@pytest.fixture(scope="module")
def aging_engine(engines: dict[str, EngineProc]) -> EngineProc:
    return engines["stjf-aging"]


def _collect(engine: EngineProc):
    c = Collector(engine)
    time.sleep(0.3)  # let the subscription reach the publisher
    yield c
    c.close()


@pytest.fixture
def collector(engine):
    yield from _collect(engine)


@pytest.fixture
def aging_collector(aging_engine):
    yield from _collect(aging_engine)


def _client(url: str) -> httpx.AsyncClient:
    """A client that drops a pooled connection after 2 s idle: vLLM's server closes one
    after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and httpx's default (5 s) can reuse it in
    that instant ("Server disconnected without sending a response", seen in CI on a
    ``/pause`` sent after a long wait for telemetry)."""
    return httpx.AsyncClient(base_url=url, limits=httpx.Limits(keepalive_expiry=2.0))


async def _complete(client: httpx.AsyncClient, prompt: str, max_tokens: int,
                    priority: int | None = None) -> dict:
    body = {"model": "tiny-a", "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0}
    if priority is not None:
        body["priority"] = priority
    r = await client.post("/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


async def _wait_for(collector: Collector, predicate, timeout: float = 120,
                    watch: list[asyncio.Task] = ()) -> SchedulerSnapshot:
    """The newest snapshot matching ``predicate`` among the 50 before the call and all
    that arrive during it (a starved client may poll long after the match); a failed
    task in ``watch`` is raised at once instead of waiting out the timeout."""
    start = max(0, len(collector.snapshots) - 50)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in watch:
            if task.done() and task.exception() is not None:
                raise task.exception()
        for snap in reversed(collector.snapshots[start:]):
            if predicate(snap):
                return snap
        await asyncio.sleep(0.02)
    seen = sorted({(s.batch_size, s.num_waiting) for s in collector.snapshots})
    snaps = collector.snapshots
    raise AssertionError(
        f"no snapshot matched in {timeout}s; (batch, waiting) seen: {seen}; "
        f"{len(snaps)} snapshots, last step {snaps[-1].step if snaps else None}; "
        f"stats {collector.snap_decoder.stats} malformed {collector.snap_decoder.malformed}; "
        f"tasks {[(t.get_coro().__name__, t.done()) for t in watch]}")


async def _queue_while_paused(client: httpx.AsyncClient, engine: EngineProc,
                              collector: Collector, requests: list,
                              arrivals: int | None = None) -> tuple[list[asyncio.Task], int]:
    """Pause the engine, send ``requests`` (coroutines), wait until its API server has sent
    ``arrivals`` requests (default: one per coroutine) to the engine core, then resume.
    The API server logs "Added request" once it has sent one; ``/resume`` reaches the core
    over the same socket, after them, so they are all in the scheduler when it starts.
    Returns the tasks and the last engine step before the resume."""
    arrivals = len(requests) if arrivals is None else arrivals
    (await client.post("/pause", params={"mode": "keep"})).raise_for_status()
    mark = engine.log_path.stat().st_size

    def added() -> int:
        with engine.log_path.open("rb") as f:
            f.seek(mark)
            return f.read().count(b"Added request")

    tasks = [asyncio.create_task(r) for r in requests]
    deadline = time.monotonic() + 120
    while added() < arrivals:
        assert time.monotonic() < deadline, \
            f"{added()} of {arrivals} requests reached the engine core in 120 s"
        for t in tasks:
            if t.done():
                t.result()  # raises what went wrong
        await asyncio.sleep(0.05)
    before = collector.snapshots[-1].step if collector.snapshots else -1
    (await client.post("/resume")).raise_for_status()
    return tasks, before


def _first_step_after(collector: Collector, step: int) -> SchedulerSnapshot:
    return next(s for s in collector.snapshots if s.step > step and not s.heartbeat)


def test_service_order_follows_the_key(engine, collector):
    # Five requests queued together while paused leave in key order once resumed, the
    # unprioritized one last. They all wait from the same step, so aging promotes them
    # together and keeps their relative order.
    async def run():
        async with _client(engine.url) as client:
            done: list[str] = []

            async def job(name, prio):
                await _complete(client, f"request {name}", 4, prio)
                done.append(name)

            jobs = [job(name, prio) for name, prio in
                    [("p50", 50), ("p10", 10), ("none", None), ("p30", 30), ("p20", 20)]]
            tasks, before = await _queue_while_paused(client, engine, collector, jobs)
            await asyncio.gather(*tasks)
            return done, before

    done, before = asyncio.run(run())
    first = _first_step_after(collector, before)
    assert (first.batch_size, first.num_waiting) == (1, 4), "not all five were queued"
    assert done == ["p10", "p20", "p30", "p50", "none"]


def test_low_priority_request_is_served_within_the_aging_bound(aging_engine, aging_collector):
    """A low-priority request under a steady stream of short high-priority ones.

    The low request and the first ``outstanding`` shorts are queued while the engine is
    paused, so all of them wait in the scheduler when serving starts (checked at the first
    step); each finished short is replaced by a new one, so at most ``outstanding`` shorts
    are in the engine at any time. Measured in engine steps from telemetry (every step is
    published on this engine), not by client-side timing: the low request has a long
    prompt, so the steps during which its uncomputed prompt shows in
    ``queued_prefill_tokens`` are exactly its wait; it came during the pause, so the last
    step before the resume is its arrival step."""
    engine, collector = aging_engine, aging_collector
    short_tokens, n_short, outstanding, low_prompt_words = 4, 80, 10, 300
    promotions = 3
    low_prompt = " ".join(["low"] * low_prompt_words)

    async def run() -> int:
        async with _client(engine.url) as client:
            sem = asyncio.Semaphore(outstanding)

            async def short(i: int) -> None:
                async with sem:
                    await _complete(client, f"short {i}", short_tokens, 1)

            async def stream() -> None:
                await asyncio.gather(*(short(i) for i in range(n_short)))

            tasks, before = await _queue_while_paused(
                client, engine, collector,
                [stream(), _complete(client, low_prompt, 2, 1_000_000)], outstanding + 1)
            await asyncio.gather(*tasks)
            # Every step's snapshot is sent before the idle heartbeat that follows it on
            # the same socket: wait for one, or the tail of the run may not be here yet.
            after = max(s.seq for s in collector.snapshots)
            await _wait_for(collector, lambda s: s.heartbeat and s.seq > after)
            return before

    before = asyncio.run(run())
    steps = [s for s in collector.snapshots if s.step > before and not s.heartbeat]
    first = steps[0]
    assert (first.step, first.batch_size, first.num_waiting) == (before + 1, 1, outstanding) \
        and first.queued_prefill_tokens >= low_prompt_words // 2, \
        f"not all of the low request and {outstanding} shorts were queued at the resume: {first}"
    admitted = next(s for s in steps if s.queued_prefill_tokens < low_prompt_words // 2)
    waited = admitted.step - before
    # A short waits behind at most outstanding - 1 others and the low request (2 steps):
    # 9 * 4 + 2 = 38 < 3S steps, so none reaches level -3; the low request does after 3S
    # steps waiting and is admitted once the running short finishes (at most short_tokens
    # more steps). The wait is bracketed by the step before the resume (its arrival: the
    # engine does not step while paused) and the first step seen without it.
    # Without aging (--max-promotions 0) it waits until no short is left waiting: 109 steps
    # of a 376-step stream when measured, admitted the moment the client let the queue run
    # dry.
    bound = promotions * S + short_tokens
    print(f"low request waited {waited} steps (bound {bound}), admitted over "
          f"{admitted.num_waiting} waiting shorts")
    assert waited <= bound, f"low request waited {waited} steps, bound {bound}"
    # It cannot pass the shorts queued with it (as old, and ahead by priority): 4 steps each.
    assert waited > outstanding * short_tokens, f"low request waited only {waited} steps"


def test_a_killed_servers_engine_core_falls_silent(aging_engine, aging_collector):
    """SIGKILL to the API server leaves vLLM's EngineCore running (the launcher kills the
    tree later); its telemetry must stop at once, or its heartbeats keep the dead engine
    up at the router. Runs last on this module's aging engine, which it kills."""
    engine, collector = aging_engine, aging_collector
    server = psutil.Process(engine.proc.pid)
    cores = server.children(recursive=True)
    assert cores, "the engine server has no EngineCore process"
    before = len(collector.snapshots)
    time.sleep(1.5)  # idle: heartbeats every 0.5 s
    assert len(collector.snapshots) > before, "no heartbeat from the live engine"
    try:
        server.kill()
        engine.proc.wait(timeout=30)
        time.sleep(0.5)  # what was sent before the kill
        after = len(collector.snapshots)
        time.sleep(2.0)
        assert any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in cores), \
            "the EngineCore died with its server: nothing to test"
        assert len(collector.snapshots) == after, "the orphaned EngineCore still publishes"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.proc.pid, signal.SIGKILL)


def test_telemetry_reports_batch_and_waiting(engine, collector):
    # A long request with the best priority runs while three short ones wait behind it;
    # once that state is seen and it has decoded some tokens, the engine is paused (which
    # freezes the running request) and the blocker is cancelled (the client disconnects,
    # vLLM aborts it), so it cannot finish before the abort. A client starved on 2 cores
    # may only look after the blocker has finished: that attempt cannot test the abort and
    # is repeated (at most 3 times).
    async def attempt(client: httpx.AsyncClient):
        long = _complete(client, "blocker", 4000, 1)
        short = [_complete(client, f"w{i}", 3, 5) for i in range(3)]
        first = collector.snapshots[-1].seq if collector.snapshots else -1
        (blocker, *rest), before = await _queue_while_paused(client, engine, collector,
                                                              [long, *short])
        held = await _wait_for(collector, lambda s: s.step > before
                               and (s.batch_size, s.num_waiting) == (1, 3)
                               and 0 < s.pending_decode_tokens < 4000,
                               watch=[blocker, *rest])
        (await client.post("/pause", params={"mode": "keep"})).raise_for_status()
        blocker.cancel()  # frozen, it is aborted before it can resume; or it had finished
        end = await _wait_for(collector, lambda s: s.seq > first and any(
            f.reason == "abort" or f.output_tokens == 4000 for f in s.finished))
        aborted = any(f.reason == "abort" for f in end.finished)
        (await client.post("/resume")).raise_for_status()
        return held, await asyncio.gather(*rest), aborted, first

    async def run():
        async with _client(engine.url) as client:
            for _ in range(3):
                if (got := await attempt(client))[2]:
                    return got
        raise AssertionError("the client saw the blocker only after it finished, 3 times")

    held, results, _, first = asyncio.run(run())
    assert held.batch_size == 1 and held.pending_decode_tokens > 0
    assert held.queued_prefill_tokens > 0  # the three prompts are not computed yet
    time.sleep(1.5)  # idle: at least one heartbeat
    snaps = collector.snapshots
    assert snaps, "no telemetry received"
    assert all(s.engine_id == "stjf-e2e-0" for s in snaps)
    assert max(s.batch_size for s in snaps) == 1  # max_num_seqs=1
    seqs = [s.seq for s in snaps]
    assert seqs == sorted(seqs) and collector.snap_decoder.malformed == 0
    finished = {f.request_id.rsplit("-", 1)[0]: f for s in snaps if s.seq > first
                for f in s.finished}
    shorts = set()
    for res in results:  # engine ids are "<client id>-<8 hex>" (completions add "-0")
        key = res["id"] + "-0" if res["id"] + "-0" in finished else res["id"]
        assert (finished[key].output_tokens, finished[key].reason) == (3, "length")
        shorts.add(key)
    (blocker,) = [f for k, f in finished.items() if k not in shorts]
    assert blocker.reason == "abort"
    assert 0 < blocker.output_tokens < 4000  # the aborted blocker, after the tokens it decoded
    assert snaps[-1].heartbeat and snaps[-1].batch_size == 0 and snaps[-1].num_waiting == 0


def test_kv_events_carry_block_hashes_of_a_long_prompt(engine, collector):
    prompt = " ".join(f"word{i}" for i in range(400))
    tokens = httpx.post(f"{engine.url}/tokenize", json={"model": "tiny-a", "prompt": prompt},
                        timeout=60).json()["tokens"]
    assert len(tokens) > 256
    asyncio.run(_run_one(engine.url, prompt))
    time.sleep(0.5)
    stored = [e for e in collector.kv_events if isinstance(e, BlockStored)]
    assert stored, "no BlockStored events"
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) >= len(tokens) // 128
    first = stored[0]
    assert first.block_size == 128
    assert first.token_ids[:128] == tokens[:128]
    assert all(isinstance(h, int) for h in hashes)


async def _run_one(url: str, prompt: str) -> None:
    async with _client(url) as client:
        await _complete(client, prompt, 2, 3)


@pytest.mark.parametrize("body_priority,header,fragment", [
    ("high", None, "must be an integer"),
    (1.5, None, "must be an integer"),
    (True, None, "must be an integer"),
    (-1, None, "must be in [0, 2147483647]"),
    (2**31, None, "must be in [0, 2147483647]"),
    (None, "soon", "header X-Vllm-Priority must be an integer"),
    (None, "-3", "header X-Vllm-Priority must be in"),
])
def test_bad_priority_is_rejected_and_engine_untouched(engine, collector, body_priority,
                                                       header, fragment):
    time.sleep(0.2)
    before = [s for s in collector.snapshots if not s.heartbeat]
    body = {"model": "tiny-a", "prompt": "x", "max_tokens": 2}
    if body_priority is not None:
        body["priority"] = body_priority
    headers = {"X-Vllm-Priority": header} if header is not None else {}
    r = httpx.post(f"{engine.url}/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert fragment in err["message"] and err["param"] == "priority"
    time.sleep(0.3)
    after = [s for s in collector.snapshots if not s.heartbeat]
    assert len(after) == len(before), "the engine stepped for a rejected request"
