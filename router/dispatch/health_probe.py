"""Brings back engines that were marked down after a failed HTTP call.

A connection error marks an engine down at once (``RouterCore.mark_engine(...,
probe=True)``). Without a launcher to say it is back, such an engine would stay down
forever; this prober asks its ``GET /health`` every ``interval_s`` and marks it up on
a 200. Marks from an operator or the launcher (``probe=False``) are left to them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

log = logging.getLogger("hetserve.router")

HEALTH_PROBE_INTERVAL_S = 1.0
HEALTH_PROBE_TIMEOUT_S = 2.0


class HealthProber:
    def __init__(self, urls: dict[str, str], mark_up: Callable[[str], None],
                 interval_s: float = HEALTH_PROBE_INTERVAL_S) -> None:
        self.urls = urls
        self.mark_up = mark_up
        self.interval_s = interval_s
        self.pending: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, name: str) -> None:
        self.pending.add(name)

    def forget(self, name: str) -> None:
        self.pending.discard(name)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hetserve-health-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=HEALTH_PROBE_TIMEOUT_S) as client:
            while True:
                await asyncio.sleep(self.interval_s)
                for name in sorted(self.pending):
                    if await _healthy(client, f"{self.urls[name]}/health"):
                        if name in self.pending:  # not taken over meanwhile
                            self.pending.discard(name)
                            log.warning("engine %s answers /health again: marking it up", name)
                            self.mark_up(name)


async def _healthy(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url)).status_code == 200
    except httpx.HTTPError:
        return False
