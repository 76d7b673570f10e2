"""The Python ceiling of the front benchmark: the least a Python proxy can do per request.

aiohttp server and client on uvloop, round robin over the engines, the body forwarded
unread and the answer relayed chunk by chunk; no parsing, routing or metrics.
``python -m kernels_bench.front.passthrough --port P --engine URL [--engine URL ...]``.
"""

from __future__ import annotations

import argparse
import itertools

import aiohttp
from aiohttp import web

_HOP = {"host", "content-length", "transfer-encoding", "connection"}


def make_app(engines: list[str]) -> web.Application:
    urls = itertools.cycle(engines)
    app = web.Application()

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with app["session"].request(request.method, next(urls) + request.path,
                                          data=await request.read(), headers=headers) as up:
            out = web.StreamResponse(status=up.status, headers={
                "content-type": up.headers.get("content-type", "application/json")})
            await out.prepare(request)
            async for data in up.content.iter_any():
                await out.write(data)
            await out.write_eof()
            return out

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels_bench.front.passthrough",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", action="append", required=True, help="engine base URL")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.install()
    web.run_app(make_app([e.rstrip("/") for e in args.engine]), host=args.host,
                port=args.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
