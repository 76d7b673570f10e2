"""The router's listening sockets: its TCP port, alone, shared or inherited, and its unix
socket.

Several router workers serve one port in one of two ways. Started by hand, each binds its
own socket with ``SO_REUSEPORT`` (``tcp_socket(shared=True)``): the kernel spreads new
connections over the sockets, and a worker that dies takes with it the connections
waiting in its own accept queue (reset, unless ``net.ipv4.tcp_migrate_req`` is 1).
Started by the launcher, they inherit one socket it bound (``public_socket``) and pass
its descriptor (``--listen-fd``, ``inherited_socket``): one accept queue, so a worker that
dies takes only the connections it had accepted.
"""

from __future__ import annotations

import errno
import os
import socket
import stat

BACKLOG = 4096


def tcp_socket(host: str, port: int, shared: bool = False) -> socket.socket:
    """A listening socket; ``shared``: other router workers bind the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


def public_socket(host: str, port: int) -> socket.socket:
    """The router's port bound for workers to inherit, not yet listening: clients are
    refused, not queued, until the first worker is ready and listens on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def inherited_socket(fd: int, port: int) -> socket.socket:
    """The TCP socket inherited as descriptor ``fd``, bound to ``port``, listening
    (``listen`` again is harmless). ValueError says what ``fd`` is instead."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        raise ValueError(f"--listen-fd {fd}: no such open descriptor (start the router with "
                         "it inherited, e.g. subprocess pass_fds)") from None
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"--listen-fd {fd}: not a socket")
    sock = socket.socket(fileno=fd)
    try:
        _check(sock, fd, port)
        sock.listen(BACKLOG)
    except (ValueError, OSError):
        sock.detach()  # the descriptor stays its owner's
        raise
    return sock


def _check(sock: socket.socket, fd: int, port: int) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        raise ValueError(f"--listen-fd {fd}: a {sock.family.name} socket, not TCP")
    if sock.type != socket.SOCK_STREAM:
        raise ValueError(f"--listen-fd {fd}: a {sock.type.name} socket, not SOCK_STREAM")
    try:
        peer = sock.getpeername()
    except OSError as e:
        if e.errno != errno.ENOTCONN:
            raise
    else:
        raise ValueError(f"--listen-fd {fd}: a connection (to {peer[0]}:{peer[1]}), not a "
                         "listening socket")
    bound = sock.getsockname()[1]
    if bound != port:
        raise ValueError(f"--listen-fd {fd}: bound to port {bound or 'none'}, the router's "
                         f"port is {port}")


def unix_socket(path: str) -> socket.socket:
    """Bind ``path`` (replacing a stale socket file, never any other file), mode 0600."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(BACKLOG)
    return sock
