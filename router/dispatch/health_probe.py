"""Brings back engines that were marked down after a failed HTTP call: a circuit breaker.

A failed call (connection refused or broken, an engine silent past a timeout) marks an
engine down at once (``Membership.mark_engine(..., probe=True)``): the breaker opens.
Without a launcher to say it is back, such an engine would stay down forever; this prober
asks its ``GET /health`` once the backoff has passed and marks it up on a 200 (half-open:
requests go to it again). The backoff after the k-th trip since the engine last completed
a request is ``min(backoff_s * 2**(k - 1), backoff_max_s)`` (``backoff``); a completed
request closes the breaker (k back to 0), so an engine that answers ``/health`` but fails
its calls is retried ever more rarely instead of flapping every second. Marks from an
operator or the launcher (``probe=False``) are left to them.

The probes share one aiohttp session of their own (the router's one HTTP client library):
``HEALTH_PROBE_TIMEOUT_S`` to connect and between reads, no proxy from the environment,
and idle connections kept under vLLM's keep-alive, as the engine pool's
(``router.upstream``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from router.upstream import IDLE_KEEPALIVE_S

log = logging.getLogger("hetserve.router")

HEALTH_PROBE_INTERVAL_S = 1.0
HEALTH_PROBE_TIMEOUT_S = 2.0


def backoff(trips: int, backoff_s: float, backoff_max_s: float) -> float:
    """Seconds before probing an engine after its ``trips``-th consecutive trip (>= 1)."""
    return min(backoff_s * 2.0 ** min(trips - 1, 62), backoff_max_s)


class HealthProber:
    def __init__(self, urls: dict[str, str], mark_up: Callable[[str], None],
                 interval_s: float = HEALTH_PROBE_INTERVAL_S, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``interval_s``: how often due probes are looked for; ``backoff_s``,
        ``backoff_max_s``: the breaker's (``[router] breaker_backoff_s``, ``_max_s``)."""
        self.urls = urls
        self.mark_up = mark_up
        self.interval_s = interval_s
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.clock = clock
        self.pending: dict[str, float] = {}
        """Engine -> when it may be probed."""
        self.trips: dict[str, int] = {}
        """Engine -> trips since it last completed a request."""
        self._task: asyncio.Task[None] | None = None

    def watch(self, name: str) -> None:
        """The engine's breaker opened: probe it after the backoff."""
        k = self.trips[name] = self.trips.get(name, 0) + 1
        self.pending[name] = self.clock() + backoff(k, self.backoff_s, self.backoff_max_s)

    def forget(self, name: str) -> None:
        self.pending.pop(name, None)

    def succeeded(self, name: str) -> None:
        """The engine completed a request: its breaker closes."""
        self.trips.pop(name, None)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hetserve-health-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=HEALTH_PROBE_TIMEOUT_S,
                                        sock_read=HEALTH_PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=IDLE_KEEPALIVE_S),
                timeout=timeout, trust_env=False) as client:
            while True:
                await asyncio.sleep(self.interval_s)
                now = self.clock()
                for name in sorted(n for n, t in self.pending.items() if t <= now):
                    if await _healthy(client, f"{self.urls[name]}/health"):
                        if name in self.pending:  # not taken over meanwhile
                            self.pending.pop(name, None)
                            log.warning("engine %s answers /health again: marking it up", name)
                            self.mark_up(name)


async def _healthy(client: aiohttp.ClientSession, url: str) -> bool:
    """``GET url`` answered 200 (redirects not followed); False on any transport error."""
    try:
        async with client.get(url, allow_redirects=False) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
