"""Stand-in stock vLLM engines for the scrape benchmark: N aiohttp servers on loopback
(free ports), each answering ``GET /metrics`` with a fixed body and vLLM's content type.

``python -m kernels_bench.scrape.standin --servers N --body FILE`` prints the ports as
one JSON line, then serves until its standard input closes (the benchmark's end, or its
death), so the stand-ins' CPU is never the benchmark process's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What vLLM's ``/metrics`` (prometheus_client) answers with."""


def app(body: bytes) -> web.Application:
    """An app answering ``GET /metrics`` with ``body``."""
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    application = web.Application()
    application.router.add_get("/metrics", metrics)
    return application


async def serve(servers: int, body: bytes) -> None:
    """Serve ``servers`` ports, print them, return when stdin closes."""
    runner = web.AppRunner(app(body), access_log=None)
    await runner.setup()
    try:
        for _ in range(servers):
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        print(json.dumps([addr[1] for addr in runner.addresses]), flush=True)
        await asyncio.to_thread(sys.stdin.read)
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.scrape.standin",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", type=int, required=True, help="how many ports to serve")
    p.add_argument("--body", type=Path, required=True, help="the /metrics body to serve")
    a = p.parse_args(argv)
    asyncio.run(serve(a.servers, a.body.read_bytes()))


if __name__ == "__main__":
    main()
