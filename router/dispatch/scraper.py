"""``MetricsScraper``: stock vLLM engines (``kind = "vllm"``) read from their ``/metrics``.

One task per stock engine: every ``interval_s`` (start to start; one scrape at a time per
engine, the next right after a slow one) it sends ``GET /metrics`` over one keep-alive
connection pool, reads at most ``MAX_METRICS_BYTES`` within ``timeout_s``, parses the
body (``router.state.vllm_metrics.parse_metrics``) and hands the reading to ``handle``
with the wall time the scrape was sent. A failed scrape (no connection, a timeout, a
status other than 200, a body too large or unusable, any other error) is counted per
engine and reason, logged at most once per ``LOG_INTERVAL_S`` per engine, and changes no
engine state: an engine whose scrapes keep failing goes stale and is down after
``scrape_timeout_s`` (``router.state.engines``), and its next good scrape brings it back.
A failure of the handler itself is counted as ``error`` and the loop goes on. With
``[router] workers`` > 1 each router process scrapes every stock engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Callable

import aiohttp

from router.dispatch.subscriber import LOG_INTERVAL_S
from router.state.vllm_metrics import MAX_METRICS_BYTES, MetricsError, VllmMetrics, parse_metrics

Handler = Callable[[str, float, VllmMetrics], None]
"""(engine, wall time the scrape was sent, its reading) -> None."""

FAILURES = ("connect", "timeout", "status", "too_large", "malformed", "error")
"""Reasons a scrape fails (``hetserve_scrapes{outcome}``)."""

log = logging.getLogger("hetserve.router")


class MetricsScraper:
    def __init__(self, urls: dict[str, str], handle: Handler, interval_s: float,
                 timeout_s: float) -> None:
        """``urls``: engine -> base URL (the dict is shared: a moved engine is scraped at
        its new URL)."""
        self.urls = urls
        self._handle = handle
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.scrapes: dict[str, Counter[str]] = {}
        """Engine -> outcome (``ok`` or a reason of ``FAILURES``) -> count."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._next_log: dict[str, float] = {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self, engines: list[str]) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            headers={"Accept-Encoding": "identity"}, auto_decompress=False)
        for name in engines:
            self.add(name)

    def add(self, name: str) -> None:
        """Scrape one more engine (nothing if it is scraped already)."""
        if name in self._tasks or self._session is None:
            return
        self.scrapes.setdefault(name, Counter())
        self._tasks[name] = asyncio.create_task(self._run(name), name=f"scrape {name}")

    def remove(self, name: str) -> None:
        """Stop scraping an engine (its task ends at its next await)."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        self.scrapes.pop(name, None)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for name in list(self._tasks):
            self.remove(name)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            self._done(name, *await self._scrape(name))
            await asyncio.sleep(max(0.0, start + self.interval_s - loop.time()))

    async def _scrape(self, name: str) -> tuple[float, VllmMetrics | None, str, str]:
        """(wall time sent, reading or None, outcome, detail)."""
        assert self._session is not None
        sent = time.time()
        try:
            async with self._session.get(self.urls[name] + "/metrics") as resp:
                if resp.status != 200:
                    return sent, None, "status", f"HTTP {resp.status}"
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        return sent, None, "too_large", f"over {MAX_METRICS_BYTES} bytes"
        except asyncio.TimeoutError:
            return sent, None, "timeout", f"no answer within {self.timeout_s:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return sent, None, "connect", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # anything else fails this scrape alone, not the loop
            return sent, None, "error", f"{type(exc).__name__}: {exc}"
        try:
            return sent, parse_metrics(bytes(body)), "ok", ""
        except MetricsError as exc:
            return sent, None, "malformed", str(exc)

    def _done(self, name: str, sent: float, reading: VllmMetrics | None, outcome: str,
              detail: str) -> None:
        """Count a scrape's outcome and hand a good reading on."""
        if reading is not None:
            try:
                self._handle(name, sent, reading)
            except Exception as exc:  # one bad update must not end the engine's scrapes
                outcome, detail = "error", f"{type(exc).__name__}: {exc}"
        counts = self.scrapes.get(name)
        if counts is None:  # removed meanwhile
            return
        counts[outcome] += 1
        now = time.monotonic()
        if outcome != "ok" and now >= self._next_log.get(name, float("-inf")):
            self._next_log[name] = now + LOG_INTERVAL_S
            failed = sum(n for k, n in counts.items() if k != "ok")
            log.warning("engine %s: /metrics scrape failed (%s: %s); %d failed so far",
                        name, outcome, detail[:300], failed)
