"""``--scale``'s control channel: the launcher's answers over a real ipc socket, for
requests it refuses before touching Ray (the scaling itself: tests/e2e/test_launcher_ray.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest
import zmq

from launcher import LaunchError
from launcher.console import Console
from launcher.planner import make_plan
from launcher.scale import CONTROL_NAME, Scaler, ScaleReply, ask_to_scale, control_endpoint
from launcher.supervisor import Supervisor
from launcher.settings import load_launch_config
from router.config import cluster as cc


@pytest.fixture(autouse=True)
def no_policy_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "_policy_validator", lambda: None)


def scaler(tmp_path: Path) -> Scaler:
    (tmp_path / "c.toml").write_text(
        '[router]\npolicy = "round_robin"\n[cluster]\nbackend = "ray"\n'
        '[[engines]]\nname = "b"\nmodel = "builtin:tiny-b"\n')
    run = tmp_path / "run"
    run.mkdir()
    plan = make_plan(load_launch_config(tmp_path / "c.toml"), None,  # type: ignore[arg-type]
                     run, port_free=lambda h, p: True, ray_host="127.0.0.1")
    sup = Supervisor(run, health_timeout_s=5, max_restarts=0, backoff_s=1, backoff_max_s=1)
    return Scaler(plan, sup, Console(), lambda *a: 0, lambda name: 0, 1.0, 1.0,
                  lambda plan: None)


def answer(s: Scaler, send: object) -> ScaleReply:
    """Send ``send`` (bytes as they are, else a request) and step the scaler until it
    answers."""
    result: list[ScaleReply | Exception] = []

    def ask() -> None:
        if isinstance(send, bytes):
            sock = zmq.Context.instance().socket(zmq.REQ)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.connect(control_endpoint(s.plan.run_dir))
            sock.send(send)
            result.append(msgspec.msgpack.decode(sock.recv(), type=ScaleReply))
            sock.close(linger=0)
            return
        try:
            name, n = send  # type: ignore[misc]
            result.append(ask_to_scale(s.plan.run_dir, name, n, timeout_s=5))
        except LaunchError as e:
            result.append(e)

    t = threading.Thread(target=ask)
    t.start()
    while t.is_alive():
        s.step()
        t.join(0.01)
    assert isinstance(result[0], ScaleReply), result
    return result[0]


def test_refusals_are_answered_and_change_nothing(tmp_path: Path) -> None:
    s = scaler(tmp_path)
    try:
        reply = answer(s, ("nope", 2))
        assert not reply.ok and "no engine entry 'nope'" in reply.message
        reply = answer(s, ("b", 1))
        assert reply.ok and "already 1 replicas" in reply.message
        reply = answer(s, ("b", 2))  # placing needs Ray: refused, nothing left started
        assert not reply.ok and "remote_start" in reply.message
        assert s.sup.procs == [] and not s.joining
        assert [p.spec.name for p in s.plan.engines] == ["b-0"]
        reply = answer(s, b"\xc1garbage")
        assert not reply.ok and "malformed request" in reply.message
        reply = answer(s, msgspec.msgpack.encode({"engine": "b", "replicas": 0}))
        assert not reply.ok and "malformed request" in reply.message
        bad = msgspec.msgpack.encode({"engine": "\x00\x00", "replicas": 2})
        reply = answer(s, bad.replace(b"\xa2\x00\x00", b"\xa2\x00\x80"))  # not UTF-8
        assert not reply.ok and "malformed request" in reply.message
    finally:
        s.close()


def test_no_launcher_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="no launcher is running"):
        ask_to_scale(tmp_path, "b", 2, timeout_s=1)
    (tmp_path / CONTROL_NAME).touch()  # left by a launcher that died
    with pytest.raises(LaunchError, match="nothing listens"):
        ask_to_scale(tmp_path, "b", 2, timeout_s=1)
