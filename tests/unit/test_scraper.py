"""The router's ``/metrics`` scraper of stock vLLM engines against a hostile stand-in: a
real aiohttp server on loopback that serves vLLM's real body, then garbage of every kind.
The router's core (``RouterCore``, its real scraper and engine table) must count each
failure, keep the engine's last good state, mark it down once its scrapes have failed for
``scrape_timeout_s`` and bring it back with the next good scrape."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Awaitable, Callable

import pytest
from aiohttp import web

from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import RemoteEngine
from router.dispatch.core import RouterCore
from router.state.vllm_metrics import MAX_METRICS_BYTES
from tests.remote_cluster import silent

REAL = (Path(__file__).parents[1] / "fixtures" / "vllm_metrics.txt").read_bytes()
BUSY = REAL.replace(b'vllm:num_requests_running{engine="0",model_name="tiny-a"} 0.0',
                    b'vllm:num_requests_running{engine="0",model_name="tiny-a"} 3.0')
INTERVAL_MS, TIMEOUT_S = 20.0, 0.6


class StandIn:
    """What ``/metrics`` answers, switched by the test."""

    def __init__(self) -> None:
        self.mode = "good"
        self.hits = 0

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        mode = self.mode
        if mode == "good":
            return web.Response(body=BUSY)
        if mode == "status":
            return web.Response(status=500, text="boom")
        if mode == "nan":
            return web.Response(body=BUSY.replace(b"} 3.0", b"} NaN", 1))
        if mode == "junk":
            return web.Response(body=bytes(range(256)) * 64)
        if mode == "huge":  # streamed without a length, past the bound
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(MAX_METRICS_BYTES // (1 << 16) + 2):
                await resp.write(b"vllm:x 1\n" * (1 << 13))
            return resp
        if mode == "slow":  # headers at once, the body never
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b"vllm:num_requests_running 1\n")
            while self.mode == "slow":
                await asyncio.sleep(0.05)
            return resp
        assert mode == "close"
        assert request.transport is not None
        request.transport.close()
        return web.Response()


async def _with_core(test: Callable[[RouterCore, StandIn], Awaitable[None]]) -> None:
    stand_in = StandIn()
    app = web.Application()
    app.router.add_get("/metrics", stand_in.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    core = RouterCore(ClusterConfig(
        source="test.toml",
        router=RouterConfig(policy="round_robin", scrape_interval_ms=INTERVAL_MS,
                            scrape_timeout_s=TIMEOUT_S),
        engines=[RemoteEngine(name="stock", served_model_name="m", kind="vllm",
                              url=f"http://127.0.0.1:{port}"),
                 RemoteEngine(name="other", served_model_name="m",  # never answers
                              url="http://other:8000", telemetry_endpoint=silent("other")[0],
                              kv_events_endpoint=silent("other")[1])]))
    await core.start()
    try:
        await test(core, stand_in)
    finally:
        await core.stop()
        await runner.cleanup()


async def _until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Until ``check`` holds; fails past ``timeout_s`` (a deadline, not a speed claim)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("mode, outcome", [
    ("status", "status"), ("nan", "malformed"), ("junk", "malformed"),
    ("huge", "too_large"), ("slow", "timeout"), ("close", "connect")])
def test_a_hostile_body_fails_closed(mode: str, outcome: str) -> None:
    async def test(core: RouterCore, stand_in: StandIn) -> None:
        m = core.membership
        counts = m.scraper.scrapes["stock"]
        await _until(lambda: counts["ok"] >= 2)
        before = core.state.table["stock"].snapshot
        assert before is not None and before.batch_size == 3
        stand_in.mode = mode
        await _until(lambda: counts[outcome] >= 2)
        e = core.state.table["stock"]
        assert e.snapshot is not None and e.snapshot.batch_size == 3  # kept, not corrupted
        await _until(lambda: m.engines()[1].down_reason is not None)
        assert "no good /metrics scrape" in str(m.engines()[1].down_reason)
        assert sum(counts.values()) - counts["ok"] == counts[outcome]
        stand_in.mode = "good"
        await _until(lambda: m.engines()[1].up)

    asyncio.run(_with_core(test))


def test_scrapes_keep_their_interval_and_reach_the_view() -> None:
    async def test(core: RouterCore, stand_in: StandIn) -> None:
        hits, start = stand_in.hits, time.monotonic()
        await _until(lambda: stand_in.hits >= hits + 10)  # they keep coming
        more, elapsed = stand_in.hits - hits, time.monotonic() - start
        # One at a time, start to start at least the interval apart: every scrape after the
        # first one seen here began after ``start``, so no more than this many fit.
        assert more <= elapsed / (INTERVAL_MS / 1e3) + 2, f"{more} scrapes in {elapsed:.3f} s"
        view = core.membership.engines()[1]
        assert (view.up, view.batch_size, view.num_waiting) == (True, 3, 0)
        assert view.last_seen_age_s is not None and view.last_seen_age_s < TIMEOUT_S

    asyncio.run(_with_core(test))


def test_a_removed_engine_is_no_longer_scraped() -> None:
    async def test(core: RouterCore, stand_in: StandIn) -> None:
        await _until(lambda: stand_in.hits >= 2)
        core.membership.admin_mark("stock", False, "test")
        await core.membership.admin_remove("stock")
        await asyncio.sleep(0.1)
        hits = stand_in.hits
        await asyncio.sleep(0.3)
        assert stand_in.hits == hits and "stock" not in core.membership.scraper.scrapes

    asyncio.run(_with_core(test))
