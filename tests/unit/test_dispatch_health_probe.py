"""An engine marked down after a failed HTTP call comes back once /health answers;
one marked down by the launcher or an operator stays down until marked up."""

from __future__ import annotations

import asyncio
import http.server
import threading

import pytest

from router.dispatch.core import RouterCore
from router.dispatch.health_probe import HealthProber, backoff
from tests.remote_cluster import remote_cluster


class Health(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(Health.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def make_core(url: str) -> RouterCore:
    core = RouterCore(remote_cluster("round_robin", {"e0": "a"}, url=url,
                                     heartbeat_timeout_s=2.0))
    core.membership.prober.interval_s = core.membership.prober.backoff_s = 0.05
    return core


def test_failed_call_mark_is_lifted_by_the_health_probe() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def run() -> tuple[bool, bool, bool, bool]:
        core = make_core(url)
        await core.start()
        try:
            Health.status = 503
            core.membership.mark_engine("e0", False, "connect refused", probe=True)
            await asyncio.sleep(0.3)
            down_while_unhealthy = not core.membership.engines()[0].up
            Health.status = 200
            await asyncio.sleep(0.5)
            up_after = core.membership.engines()[0].up
            core.membership.mark_engine("e0", False, "launcher: process exited")  # not probed
            await asyncio.sleep(0.3)
            launcher_mark_kept = not core.membership.engines()[0].up
            core.membership.mark_engine("e0", True, "launcher: restarted")
            return (down_while_unhealthy, up_after, launcher_mark_kept,
                    core.membership.engines()[0].up)
        finally:
            await core.stop()

    try:
        assert asyncio.run(run()) == (True, True, True, True)
    finally:
        server.shutdown()


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


def test_a_flapping_engine_is_probed_ever_more_rarely() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def run() -> list[bool]:
        core = make_core(url)
        core.membership.prober.backoff_s, core.membership.prober.backoff_max_s = 0.5, 10.0
        await core.start()
        try:
            Health.status = 200  # answers /health, but its calls fail
            seen = []
            for trip in range(3):  # trips 1..3: probed after 0.5, 1, 2 s
                core.membership.mark_engine("e0", False, "broken call", probe=True)
                due = core.membership.prober.pending["e0"]
                assert due == pytest.approx(core.membership.prober.clock() + 0.5 * 2 ** trip,
                                            abs=0.05)
                await asyncio.sleep(0.1)
                seen.append(core.membership.engines()[0].up)  # before its backoff: still down
                await asyncio.sleep(due - core.membership.prober.clock())
                deadline = core.membership.prober.clock() + 5.0  # a loaded machine: poll
                while (not core.membership.engines()[0].up
                       and core.membership.prober.clock() < deadline):
                    await asyncio.sleep(0.05)
                seen.append(core.membership.engines()[0].up)  # probed: half-open
            return seen
        finally:
            await core.stop()

    try:
        assert asyncio.run(run()) == [False, True] * 3
    finally:
        server.shutdown()
