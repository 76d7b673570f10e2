"""``python -m router --config cluster.toml [--host H] [--port P] [--uds PATH] [--worker I]
[--listen-fd N]``.

Serves the router's app (``router.app``, aiohttp on uvloop) on a TCP listener and, if a
unix socket path is configured, on that socket too. Command-line values override the
``[router]`` table; the TCP port must come from one of them. With ``router.workers`` > 1,
this process is worker ``I`` of them: it shares the port with the others and also listens
alone on ``router.worker_ports[I]`` when given (``router.dispatch.peers``). With
``--listen-fd N`` it serves the port on the inherited socket ``N`` (the launcher's: one
accept queue for all workers); without it, on a socket of its own (``SO_REUSEPORT`` with
several workers; ``router.listen``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys

import uvloop
from aiohttp import web

from router.app import RUNNER_OPTIONS, create_app
from router.config.cluster import ClusterConfig, ConfigError, load_cluster_config
from router.listen import BACKLOG, inherited_socket, tcp_socket, unix_socket


async def serve(app: web.Application, sockets: list[socket.socket]) -> None:
    """Serve ``app`` on ``sockets`` until SIGINT or SIGTERM (startup errors propagate)."""
    runner = web.AppRunner(app, **RUNNER_OPTIONS)
    await runner.setup()
    try:
        for sock in sockets:
            await web.SockSite(runner, sock, backlog=BACKLOG).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def _config(args: argparse.Namespace) -> ClusterConfig:
    config = load_cluster_config(args.config)
    overrides = {k: getattr(args, k) for k in ("host", "port", "uds")
                 if getattr(args, k) is not None}
    router = dataclasses.replace(config.router, **overrides)
    if router.port is None:
        raise ConfigError(config.source, "router.port", "not set; give --port or set it")
    if router.workers == 1 and args.worker is not None:
        raise ConfigError(config.source, "router.workers", "1: --worker is for one of "
                          "several router processes")
    if router.workers > 1 and not (args.worker is not None and 0 <= args.worker
                                   < router.workers):
        raise ConfigError(config.source, "router.workers", f"{router.workers}: give --worker "
                          f"I, I in 0..{router.workers - 1} (the launcher starts them all)")
    return dataclasses.replace(config, router=router)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="cluster TOML file (resolved form)")
    parser.add_argument("--host", help="TCP listen address (default: router.host, loopback)")
    parser.add_argument("--port", type=int, help="TCP port (default: router.port)")
    parser.add_argument("--uds", help="also listen on this unix socket (default: router.uds)")
    parser.add_argument("--worker", type=int, metavar="I",
                        help="this process's index among router.workers router processes")
    parser.add_argument("--listen-fd", type=int, metavar="N",
                        help="serve the port on inherited listening socket N (the launcher "
                        "passes one to all workers) instead of binding it")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "aiohttp.access"):  # a line per request otherwise
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        config = _config(args)
        app = create_app(config, worker=args.worker)
    except ValueError as exc:  # ConfigError, or a state the core rejects
        print(f"router: {exc}", file=sys.stderr)
        return 2
    r = config.router
    assert r.port is not None
    try:
        sockets = [tcp_socket(r.host, r.port, shared=r.workers > 1) if args.listen_fd is None
                   else inherited_socket(args.listen_fd, r.port)]
        if r.worker_ports and args.worker is not None:
            sockets.append(tcp_socket(r.host, r.worker_ports[args.worker]))
        if config.router.uds:
            sockets.append(unix_socket(config.router.uds))
    except ValueError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"router: cannot listen: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(serve(app, sockets))
    except Exception:  # a startup failure (tokenizers, predictors, sockets): logged
        logging.getLogger("router").exception("router failed")
        return 1
    finally:
        if config.router.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(config.router.uds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
