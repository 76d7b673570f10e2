"""An engine marked down after a failed HTTP call comes back once /health answers;
one marked down by the launcher or an operator stays down until marked up."""

from __future__ import annotations

import asyncio
import http.server
import threading
from types import SimpleNamespace

from router.dispatch.core import RouterCore


class Health(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(Health.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def make_core(url: str) -> RouterCore:
    inst = SimpleNamespace(name="e0", served_model_name="a", url=url, telemetry_endpoint=None,
                           kv_events_endpoint=None, max_model_len=None)
    cfg = SimpleNamespace(router=SimpleNamespace(policy="round_robin",
                                                 policies={}, heartbeat_timeout_s=2.0),
                          instances=lambda: [inst])
    core = RouterCore(cfg)
    core.prober.interval_s = 0.05
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
            core.mark_engine("e0", False, "connect refused", probe=True)
            await asyncio.sleep(0.3)
            down_while_unhealthy = not core.engines()[0].up
            Health.status = 200
            await asyncio.sleep(0.5)
            up_after = core.engines()[0].up
            core.mark_engine("e0", False, "launcher: process exited")  # not probed
            await asyncio.sleep(0.3)
            launcher_mark_kept = not core.engines()[0].up
            core.mark_engine("e0", True, "launcher: restarted")
            return down_while_unhealthy, up_after, launcher_mark_kept, core.engines()[0].up
        finally:
            await core.stop()

    try:
        assert asyncio.run(run()) == (True, True, True, True)
    finally:
        server.shutdown()
