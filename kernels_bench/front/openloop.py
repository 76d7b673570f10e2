"""An open-loop load generator: requests sent at a fixed rate whatever the answers do.

wrk's closed loop sets how many requests are outstanding, not how many arrive per second,
so it cannot say what a router adds at a given load. Here request ``i`` is due at
``i / rate`` seconds and its latency is counted from that due time (a late send counts
against the target, no coordinated omission). The client itself adds latency too;
``direct`` measured at the same rate in the same run is the baseline to subtract.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import aiohttp
import uvloop

from kernels_bench.front.wrk import WrkResult


async def measure(url: str, body: dict[str, object], rate: float, seconds: float,
                  timeout_s: float) -> WrkResult:
    """``run`` inside a running event loop."""
    payload = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    failures = {"status": 0, "socket": 0, "timeout": 0}
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), trust_env=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one(due: float) -> None:
            try:
                async with session.post(url, data=payload, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        failures["status"] += 1
                        return
            except asyncio.TimeoutError:
                failures["timeout"] += 1
                return
            except aiohttp.ClientError:
                failures["socket"] += 1
                return
            latencies.append((time.perf_counter() - due) * 1e3)

        start = time.perf_counter()
        tasks = []
        n = int(rate * seconds)
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(due)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return WrkResult(n, elapsed, len(latencies) / elapsed, cuts[49], cuts[98],
                     failures["status"], failures["socket"], failures["timeout"])


def run(url: str, body: dict[str, object], rate: float, seconds: float,
        timeout_s: float = 10.0) -> WrkResult:
    """POST ``body`` to ``url`` at ``rate`` requests/s for ``seconds``."""
    return uvloop.run(measure(url, body, rate, seconds, timeout_s))
