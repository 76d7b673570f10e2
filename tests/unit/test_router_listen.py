"""The router's inherited port socket (``router.listen``, ``--listen-fd``) and the launcher
binding it for the workers (``launcher.listener``), on real loopback sockets."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import LaunchError
from launcher.devices import Devices
from launcher.listener import share_port
from launcher.planner import make_plan
from launcher.settings import load_launch_config
from router.__main__ import main
from router.config import cluster as cc
from router.listen import inherited_socket, public_socket
from tests.engine_proc import free_port
from tests.front_server import one_engine_cluster


@pytest.fixture
def bound() -> Iterator[socket.socket]:
    sock = public_socket("127.0.0.1", 0)
    yield sock
    sock.close()


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def test_an_inherited_bound_socket_is_served(bound: socket.socket) -> None:
    """Bound, not listening (clients refused) until the router takes it; then one accept
    queue that any holder of the descriptor accepts from."""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port_of(bound)), timeout=2).close()
    sock = inherited_socket(os.dup(bound.fileno()), port_of(bound))
    with sock, socket.create_connection(("127.0.0.1", port_of(bound)), timeout=2):
        conn, _ = bound.accept()  # the same queue, through the launcher's descriptor
        conn.close()
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1


def test_a_listening_socket_is_taken_as_it_is(bound: socket.socket) -> None:
    bound.listen(8)
    with inherited_socket(os.dup(bound.fileno()), port_of(bound)) as sock:
        assert sock.getsockname() == bound.getsockname()


def _udp() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def _unix(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "s"))
    return sock


@pytest.mark.parametrize("make, message", [
    (lambda tmp, port: _udp(), "a SOCK_DGRAM socket, not SOCK_STREAM"),
    (lambda tmp, port: _unix(tmp), "a AF_UNIX socket, not TCP"),
    (lambda tmp, port: public_socket("127.0.0.1", 0), "bound to port .*, the router's port"),
    (lambda tmp, port: socket.socket(), "bound to port none"),
    (lambda tmp, port: socket.create_connection(("127.0.0.1", port)),
     "a connection \\(to 127.0.0.1:.*\\), not a listening socket"),
])
def test_what_is_not_the_ports_socket_is_refused(make, message: str, tmp_path: Path,
                                                 bound: socket.socket) -> None:
    """Each error names the descriptor and what it is; the descriptor stays open."""
    bound.listen(8)
    with make(tmp_path, port_of(bound)) as other:
        with pytest.raises(ValueError, match=f"--listen-fd {other.fileno()}: {message}"):
            inherited_socket(other.fileno(), port_of(bound))
        os.fstat(other.fileno())


def test_a_descriptor_that_is_no_socket_or_not_open_is_refused() -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(ValueError, match=f"--listen-fd {r}: not a socket"):
            inherited_socket(r, 8000)
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(ValueError, match=f"--listen-fd {r}: no such open descriptor"):
        inherited_socket(r, 8000)


def test_the_router_command_stops_on_a_bad_descriptor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_engine_cluster(tmp_path, free_port(), free_port())
    r, w = os.pipe()
    try:
        code = main(["--config", str(tmp_path / "c.toml"), "--listen-fd", str(r)])
    finally:
        os.close(r)
        os.close(w)
    assert code == 2
    assert capsys.readouterr().err == f"router: --listen-fd {r}: not a socket\n"


def plan_with(tmp_path: Path, router: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cc, "_policy_validator", lambda: None)
    path = tmp_path / "cluster.toml"
    path.write_text(f'[router]\npolicy = "round_robin"\n{router}'
                    '[[engines]]\nname = "a"\nmodel = "builtin:tiny-a"\n')
    return make_plan(load_launch_config(path), Devices(gpus=[], cpus=[0, 1]),
                     tmp_path / "run", python="python")


def test_the_launcher_binds_the_port_for_its_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    planned = plan_with(tmp_path, f"port = {port}\nworkers = 2\n", monkeypatch)
    plan, sock = share_port(planned)
    assert sock is not None
    with sock:
        assert sock.getsockname() == ("127.0.0.1", port)
        for p in plan.routers:
            assert p.spec.argv[p.spec.argv.index("--listen-fd") + 1] == str(sock.fileno())
            assert p.spec.pass_fds == (sock.fileno(),)
        assert f"--listen-fd {sock.fileno()}" in plan.render()
        with pytest.raises(LaunchError, match=rf"router.port: cannot bind 127.0.0.1:{port} "
                           "for the router workers: Address already in use"):
            sock.listen(8)  # taken since it was planned: a second launcher cannot bind it
            share_port(planned)


def test_a_lone_router_binds_its_own_port(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_with(tmp_path, f"port = {free_port()}\n", monkeypatch)
    assert share_port(plan) == (plan, None)
