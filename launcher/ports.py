"""Free TCP ports: the launcher's one search for them (planning, moving an engine, and a
Ray host on its node)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from launcher import LaunchError

PortFree = Callable[[str, int], bool]


def free_port(host: str, start: int, taken: set[int], port_free: PortFree) -> int | None:
    """The first port from ``start`` that is neither ``taken`` nor in use; None if none."""
    for port in range(start, 65536):
        if port not in taken and port_free(host, port):
            return port
    return None


def take_port(host: str, start: int, taken: set[int], port_free: PortFree,
              base_port: int | None = None) -> int:
    """``free_port``, added to ``taken``; LaunchError if there is none (naming
    ``launcher.base_port`` when the search started from it)."""
    port = free_port(host, start, taken, port_free)
    if port is None:
        where = f"launcher.base_port {base_port}" if base_port is not None else str(start)
        raise LaunchError(f"no free port on {host} from {where} upwards")
    taken.add(port)
    return port


def port_is_free(host: str, port: int) -> bool:
    """Whether a TCP server could listen on ``host:port`` now. With ``SO_REUSEADDR``, as
    the engines' and the router's servers bind: connections of a process that just died
    (TIME_WAIT) do not hold its port, a listener does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
