"""The router workers' shared port: one socket the launcher binds and every worker
inherits.

With ``router.workers`` > 1 the plan gives each worker ``--listen-fd <listen-fd>``
(``launcher.plan.LISTEN_FD``). ``share_port`` binds the router's port here (not yet
listening: clients are refused until the first worker is ready and listens) and puts the
socket's descriptor in that place and in the spec's ``pass_fds``, so every worker and
every restart of one serves the same socket: one accept queue, and a worker that dies
takes only the connections it had accepted (with a socket per worker, ``SO_REUSEPORT``,
the kernel resets those waiting in its queue). The launcher holds the socket until it
stops, so a restarted worker finds the connections that arrived meanwhile.
"""

from __future__ import annotations

import dataclasses
import socket

from launcher import LaunchError
from launcher.plan import LISTEN_FD, Plan
from router.listen import public_socket


def share_port(plan: Plan) -> tuple[Plan, socket.socket | None]:
    """``plan`` with its router workers given the bound socket of the router's port, and
    that socket (None: no worker takes one); LaunchError if the port cannot be bound."""
    if not any(LISTEN_FD in p.spec.argv for p in plan.routers):
        return plan, None
    r = plan.config.router
    assert r.port is not None
    try:
        sock = public_socket(r.host, r.port)
    except OSError as e:
        raise LaunchError(f"{plan.config.source}: router.port: cannot bind {r.host}:{r.port} "
                          f"for the router workers: {e.strerror or e}") from None
    fd = sock.fileno()
    routers = [dataclasses.replace(p, spec=dataclasses.replace(
        p.spec, argv=[str(fd) if a == LISTEN_FD else a for a in p.spec.argv],
        pass_fds=(fd,))) for p in plan.routers]
    return dataclasses.replace(plan, routers=routers), sock
