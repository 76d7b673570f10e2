"""An engine marked down after a failed HTTP call comes back once /health answers;
one marked down by the launcher or an operator stays down until marked up."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from router.dispatch.core import RouterCore
from router.dispatch.health_probe import HealthProber, backoff
from tests.remote_cluster import remote_cluster


class Health(http.server.BaseHTTPRequestHandler):
    """``GET /<engine>/health`` answers ``status[engine]`` (503 until set) and records when
    (``time.monotonic``, the prober's clock) in ``probes[engine]``."""

    status: dict[str, int]
    probes: dict[str, list[float]]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        engine, _, rest = self.path.strip("/").partition("/")
        if rest != "health":
            self.send_response(404)
        else:
            self.probes.setdefault(engine, []).append(time.monotonic())
            self.send_response(self.status.get(engine, 503))
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health() -> Iterator[tuple[str, type[Health]]]:
    """A /health server on loopback: its base URL and its handler class (fresh state)."""
    handler = type("Health", (Health,), {"status": {}, "probes": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()


def make_core(url: str, engines: tuple[str, ...] = ("e0",)) -> RouterCore:
    core = RouterCore(remote_cluster("round_robin", {e: "a" for e in engines},
                                     url=url + "/{name}", heartbeat_timeout_s=2.0))
    core.membership.prober.interval_s = core.membership.prober.backoff_s = 0.05
    return core


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Until ``check`` holds; fails past ``timeout_s`` saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.01)


def test_failed_call_mark_is_lifted_by_the_health_probe(
        health: tuple[str, type[Health]]) -> None:
    url, server = health

    async def run() -> None:
        core = make_core(url, ("e0", "e1"))
        m = core.membership
        await core.start()

        def up(name: str) -> bool:
            return next(e.up for e in m.engines() if e.name == name)

        try:
            m.mark_engine("e0", False, "connect refused", probe=True)
            await _until(lambda: len(server.probes.get("e0", [])) >= 2, "two probes")
            assert not up("e0"), "marked up while /health answered 503"
            server.status["e0"] = 200
            await _until(lambda: up("e0"), "marked up once /health answered 200")
            m.mark_engine("e0", False, "launcher: process exited")  # not probed
            probes = len(server.probes["e0"])
            # A probe round after the launcher's mark: e1's breaker, lifted by a probe.
            server.status["e1"] = 200
            m.mark_engine("e1", False, "connect refused", probe=True)
            await _until(lambda: up("e1"), "e1 marked up by its probe")
            assert not up("e0") and "e0" not in m.prober.pending
            assert len(server.probes["e0"]) == probes, "the launcher's mark was probed"
            m.mark_engine("e0", True, "launcher: restarted")
            assert up("e0")
        finally:
            await core.stop()

    asyncio.run(run())


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(k, 1.0, 30.0) for k in (1, 2, 3, 5, 6, 10**6)] == [1, 2, 4, 16, 30, 30]


def test_breaker_backs_off_until_a_request_completes() -> None:
    now = [0.0]
    marked: list[str] = []
    prober = HealthProber({"e0": "http://x"}, marked.append, backoff_s=1.0,
                          backoff_max_s=8.0, clock=lambda: now[0])
    for expected in (1.0, 2.0, 4.0, 8.0, 8.0):  # trip, probed up, trips again, ...
        prober.watch("e0")
        assert prober.pending["e0"] == now[0] + expected
    prober.succeeded("e0")  # a completed request closes the breaker
    prober.watch("e0")
    assert prober.pending["e0"] == now[0] + 1.0


def test_a_flapping_engine_is_probed_ever_more_rarely(
        health: tuple[str, type[Health]]) -> None:
    """Trips 1..3 are probed no sooner than 0.5, 1 and 2 s after their mark (the server
    records when each probe came), and the probe brings the engine back."""
    url, server = health
    server.status["e0"] = 200  # answers /health, but its calls fail

    async def run() -> None:
        core = make_core(url)
        m = core.membership
        m.prober.backoff_s, m.prober.backoff_max_s = 0.5, 10.0
        await core.start()
        try:
            for trip in range(3):
                wait = 0.5 * 2 ** trip
                before = m.prober.clock()
                m.mark_engine("e0", False, "broken call", probe=True)
                due = m.prober.pending["e0"]
                assert before + wait <= due <= m.prober.clock() + wait
                probes = len(server.probes.get("e0", []))
                await _until(lambda: m.engines()[0].up, f"trip {trip + 1} probed up")
                came = server.probes["e0"][probes:]
                assert came and min(came) >= due, (trip, due, came)
        finally:
            await core.stop()

    asyncio.run(run())
