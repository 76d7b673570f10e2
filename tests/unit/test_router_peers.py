"""Router workers' link (``router.dispatch.peers``): changes one worker publishes reach the
others over real ZeroMQ ipc sockets, and the receiving side is total (garbage, oversized
ids, unknown names are counted and dropped, never raised)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import zmq.asyncio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from router.config.cluster import parse_cluster_config
from router.dispatch.core import RouterCore
from router.dispatch.peers import (Completed, Hello, Marked, Moved, PeerEvent, Peers, Routed,
                                   State, Synced, sync_endpoints)
from router.request import MAX_LABEL_CHARS
from router.state.engine_versions import Version

V = Version(1, 1)
"""A version of worker 1's (the peer of the cores below, worker 0)."""


def _config(tmp_path: Path, workers: int = 2) -> object:
    data = {"router": {"policy": "round_robin", "port": 8000, "workers": workers,
                       "sync_dir": str(tmp_path)},
            "engines": [{"name": name, "url": f"http://127.0.0.1:{port}",
                         "served_model_name": name,
                         "telemetry_endpoint": f"ipc://{tmp_path}/{name}.t",
                         "kv_events_endpoint": f"ipc://{tmp_path}/{name}.kv"}
                        for name, port in (("a", 9001), ("b", 9002))]}
    return parse_cluster_config(data, "test.toml", tmp_path)


_CONFIG = _config(Path("/nonexistent"))


def test_events_reach_every_other_worker(tmp_path: Path) -> None:
    async def go() -> list[list[PeerEvent]]:
        endpoints = sync_endpoints(str(tmp_path), 8000, 3)
        got: list[list[PeerEvent]] = [[], [], []]
        ctx = zmq.asyncio.Context()
        peers = [Peers(endpoints, i, lambda e, got=got[i]: got.append(e) or True)
                 for i in range(3)]
        for p in peers:
            await p.start(ctx)

        async def send(sender: int, event: PeerEvent, to: list[int]) -> None:
            for _ in range(250):  # until the subscriptions are joined (a slow joiner)
                peers[sender].publish(event)
                await asyncio.sleep(0.02)
                if all(event in got[i] for i in to):
                    return

        await send(0, Routed("prog-1", "a"), [1, 2])
        await send(2, Completed("prog-1", True, False), [0, 1])
        for p in peers:
            await p.stop()
        ctx.term()
        return got

    got = asyncio.run(go())
    assert Routed("prog-1", "a") not in got[0]  # never its own
    assert Completed("prog-1", True, False) not in got[2]
    assert Routed("prog-1", "a") in got[1] and Routed("prog-1", "a") in got[2]
    assert Completed("prog-1", True, False) in got[0] and Completed("prog-1", True, False) \
        in got[1]


_LEAF = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text()
         | st.sampled_from(["routed", "completed", "marked", "moved", "a", "b", "p"]))
_VERSIONS = st.one_of(st.lists(st.integers(-2, 2**64 - 1) | st.sampled_from([0, 1, 255, 256]),
                                min_size=2, max_size=2),
                      st.lists(st.sampled_from([0, 1, 2, 2**63 - 1, 2**63]), min_size=2,
                               max_size=2), _LEAF)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=200),
    st.builds(msgspec.msgpack.encode, st.recursive(
        _LEAF, lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20)),
    st.builds(lambda tag, rest: msgspec.msgpack.encode([tag, *rest]),  # near-valid events
              st.sampled_from(["routed", "completed", "marked", "moved", "added", "removed",
                               "hello", "state", "synced"]),
              st.lists(_LEAF, max_size=4)),
    st.builds(lambda tag, name, version, rest: msgspec.msgpack.encode(  # engine events
                  [tag, name, version, *rest]),
              st.sampled_from(["marked", "moved", "added", "removed"]),
              st.sampled_from(["a", "b", "c"]) | _LEAF, _VERSIONS, st.lists(_LEAF, max_size=3))))
@example(b"\x91\xa2\x00\x80")  # a string that is not UTF-8: msgspec's UnicodeDecodeError
@example(msgspec.msgpack.encode(["added", "a", [1, 1], "[1]"]))  # an entry not an object
@example(msgspec.msgpack.encode(["added", "a", [1, 1], "5"]))
@example(msgspec.msgpack.encode(["marked", "a", [2**63, 1], True, "x"]))  # bad versions
@example(msgspec.msgpack.encode(["marked", "a", [0, 1], True, "x"]))
@example(msgspec.msgpack.encode(["marked", "a", [1, 256], True, "x"]))
@example(msgspec.msgpack.encode(["marked", "a", [1, 5], True, "x"]))  # not a worker here
@example(msgspec.msgpack.encode(["marked", "a", [1, 0], True, "x"]))  # its own index
@example(msgspec.msgpack.encode(["removed", "a", [1, 1]]))
@example(msgspec.msgpack.encode(["hello", 1]))  # a join: answered
@example(msgspec.msgpack.encode(["hello", 0]))  # its own index
@example(msgspec.msgpack.encode(["hello", 7]))  # not a worker here
@example(msgspec.msgpack.encode(["synced", 1, 0]))  # for another worker
@example(msgspec.msgpack.encode(["synced", 0, 1]))
@example(msgspec.msgpack.encode(["state", 0, ["marked", "a", [1, 0], False, "x"]]))  # own
@example(msgspec.msgpack.encode(["state", 0, ["routed", "p", "a"]]))  # not a register
@example(msgspec.msgpack.encode(["state", 1, ["removed", "a", [1, 1]]]))  # for another
def test_any_message_is_applied_or_counted(message: bytes) -> None:
    core = RouterCore(_CONFIG, worker=0)
    assert core.membership.peers is not None
    core.membership.peers.feed(message)
    peers = core.membership.peers
    assert peers.applied + peers.malformed + peers.rejected + peers.stale + peers.skipped == 1


def test_bad_versions_are_counted_and_dropped() -> None:
    """A version out of bounds (counter 0 or past 2**63 - 1, a worker index of 256 or
    more) does not decode; one of a worker the cluster does not have, or of the receiving
    worker itself, is refused; neither changes the table."""
    core = RouterCore(_CONFIG, worker=0)
    peers = core.membership.peers
    assert peers is not None
    encode = msgspec.msgpack.encode
    for counter, worker in ((0, 1), (-1, 1), (2**63, 1), (1, 256), (1, -1)):
        peers.feed(encode(["marked", "a", [counter, worker], False, "x"]))
    assert (peers.malformed, peers.rejected, peers.applied) == (5, 0, 0)
    for counter, worker in ((1, 2), (1, 0)):  # two workers: only worker 1 is a peer
        peers.feed(encode(["marked", "a", [counter, worker], False, "x"]))
    assert (peers.malformed, peers.rejected, peers.applied) == (5, 2, 0)
    assert core.state.table["a"].marked_down is None
    peers.feed(encode(["marked", "a", [2**63 - 1, 1], False, "x"]))  # the largest
    assert core.state.table["a"].marked_down == "x" and peers.applied == 1


def test_bounds_and_unknown_names_are_dropped(tmp_path: Path) -> None:
    core = RouterCore(_config(tmp_path), worker=0)
    assert core.membership.peers is not None
    feed = core.membership.peers.feed
    encode = msgspec.msgpack.encode
    feed(encode(Routed("x" * (MAX_LABEL_CHARS + 1), "a")))  # over the id bound
    feed(encode(Routed("p", "no-such-model")))
    feed(encode(Marked("no-such-engine", V, False, "gone")))
    feed(b"\x91" * 100_000)  # deeply nested
    peers = core.membership.peers
    assert (peers.malformed, peers.rejected, peers.applied) == (2, 2, 0)
    assert len(core.state.programs) == 0
    feed(encode(Routed("p", "b")))
    assert core.state.programs.model("p") == "b"
    feed(encode(Completed("p", True, False)))
    assert "p" not in core.state.programs
    feed(encode(Marked("b", V, False, "launcher: exited")))
    assert core.state.table["b"].down_reason == "marked down: launcher: exited"
    host = core.state.table["b"].url.rsplit(":", 1)[0]
    feed(encode(Moved("b", Version(2, 1), "http://10.9.9.9:9999")))  # another host: refused
    feed(encode(Moved("b", Version(2, 1), f"{host}:9999/x")))  # a path: refused
    feed(encode(Moved("b", Version(2, 1), f"{host}:9999")))
    assert core.state.table["b"].url == core.membership.prober.urls["b"] == f"{host}:9999"
    assert (core.membership.peers.rejected, core.membership.peers.applied) == (4, 4)


def test_a_worker_needs_its_index(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--worker I"):
        RouterCore(_config(tmp_path))
    assert RouterCore(_config(tmp_path, workers=1)).membership.peers is None


def test_a_starting_worker_gets_its_peers_registers(tmp_path: Path) -> None:
    """Over real sockets: worker 1 starts after worker 0 and says ``Hello`` until worker 0
    answered (ZeroMQ drops what a new PUB sends before the peer's SUB joined); worker 0
    sends it each register it holds, then ``Synced``."""
    held = [Marked("a", Version(5, 0), False, "x"), Moved("b", Version(6, 1), "http://h:1")]

    async def go() -> tuple[list[PeerEvent], set[int]]:
        endpoints = sync_endpoints(str(tmp_path), 8000, 2)
        got: list[PeerEvent] = []
        ctx = zmq.asyncio.Context()
        first = Peers(endpoints, 0, lambda e: True, lambda: held)
        await first.start(ctx)
        joiner = Peers(endpoints, 1, lambda e: got.append(e) or True)
        await joiner.start(ctx)
        for _ in range(200):
            if joiner.joined:
                break
            await asyncio.sleep(0.02)
        await joiner.stop()
        await first.stop()
        ctx.term()
        return got, joiner.joined

    got, joined = asyncio.run(go())
    assert joined == {0}
    assert [State(1, e) for e in held] == got[:2]


def test_join_messages_are_counted() -> None:
    core = RouterCore(_CONFIG, worker=0)
    peers = core.membership.peers
    assert peers is not None
    sent: list[PeerEvent] = []
    peers.publish = sent.append  # type: ignore[method-assign]
    encode = msgspec.msgpack.encode
    peers.feed(encode(Hello(1)))
    assert sent == [Synced(1, 0)]  # nothing versioned held yet
    peers.feed(encode(Synced(0, 1)))
    peers.feed(encode(Synced(1, 0)))  # for another worker (with more of them)
    assert (peers.applied, peers.skipped, peers.joined) == (2, 1, {1})
