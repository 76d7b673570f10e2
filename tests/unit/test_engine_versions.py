"""The order of admin changes across router workers (``router.state.engine_versions``):
the rule itself, and a property test that any order of delivery of one set of versioned
engine events leaves every worker's tables the same, through the real decode and apply
path (``Peers.feed`` -> ``PeerSync.apply``) of real ``RouterCore`` objects."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config.cluster import parse_cluster_config
from router.dispatch.core import RouterCore
from router.dispatch.peers import Added, EngineEvent, Hello, Marked, Moved, Removed
from router.metrics import RouterMetrics
from router.state.engine_versions import MAX_COUNTER, ORIGIN, EngineVersions, Version

# ---- the rule ----


def test_a_local_change_is_above_everything_seen() -> None:
    v = EngineVersions(["a"], worker=1, clock_ms=lambda: 0)
    assert v.stamp("a") == Version(1, 1)  # Lamport: counter = highest seen + 1
    assert v.newer("a", "mark", Version(7, 0))  # a peer's later change: learned
    assert v.stamp("a") == Version(8, 1)
    assert v.stamp("b") == Version(1, 1)  # per engine name


def test_ties_are_broken_by_worker_index() -> None:
    v = EngineVersions(["a"], worker=0, clock_ms=lambda: 0)
    mine = v.stamp("a")
    v.marked("a", mine, False, "mine")
    assert v.newer("a", "mark", Version(mine.counter, 1))  # same counter, higher index
    v.marked("a", Version(mine.counter, 1), True, "theirs")
    assert not v.newer("a", "mark", mine)  # and not back
    assert not v.newer("a", "mark", Version(mine.counter, 1))  # a duplicate


def test_the_wall_clock_is_a_floor() -> None:
    """A restarted worker (every counter at 0) wins with its next call over the changes
    it has not heard of, which were stamped earlier."""
    now = [1_000]
    before = EngineVersions(["a"], worker=0, clock_ms=lambda: now[0])
    old = before.stamp("a")
    assert old == Version(1_000, 0)
    now[0] = 5_000
    restarted = EngineVersions(["a"], worker=1, clock_ms=lambda: now[0])
    new = restarted.stamp("a")
    assert new > old and before.newer("a", "mark", new)
    assert before.stamp("a") == Version(5_001, 0)  # a clock behind never goes back
    assert EngineVersions(["a"], 0, clock_ms=lambda: 2**70).stamp("a").counter == MAX_COUNTER


def test_without_the_clock_a_restarted_worker_learns_from_messages() -> None:
    v = EngineVersions(["a"], worker=1, clock_ms=lambda: 0)
    assert v.stamp("a") == Version(1, 1)  # loses to a peer's (40, 0) ...
    assert v.newer("a", "mark", Version(40, 0))
    assert v.stamp("a") == Version(41, 1)  # ... until it heard of it


def test_fields_have_their_own_registers() -> None:
    """A mark and a move at once both hold; an add or a remove supersedes older ones."""
    v = EngineVersions(["a"], worker=2, clock_ms=lambda: 0)
    assert v.newer("a", "mark", Version(3, 0))
    v.marked("a", Version(3, 0), False, "x")
    assert v.newer("a", "place", Version(3, 1))  # not ordered against the mark
    v.moved("a", Version(3, 1), "http://h:1", None)
    assert not v.newer("a", "mark", Version(2, 1))
    assert v.mark("a") is not None and v.place("a") is not None
    v.added("a", Version(4, 0), "{}")  # a re-add at 4 drops the mark and move at 3
    assert v.mark("a") is None and v.place("a") is None
    assert not v.newer("a", "mark", Version(3, 5))  # older than the add: superseded


def test_a_removal_is_a_tombstone() -> None:
    v = EngineVersions([], worker=0, clock_ms=lambda: 0)
    v.added("c", Version(1, 1), "{}")
    v.removed("c", Version(3, 1))
    assert not v.newer("c", "life", Version(2, 2))  # a late add older than the removal
    assert not v.newer("c", "mark", Version(2, 2))
    assert v.newer("c", "life", Version(4, 2))  # a newer add brings it back
    assert v.stamp("c") == Version(5, 0)


def test_records_of_absent_engines_are_bounded() -> None:
    v = EngineVersions(["a"], worker=0, clock_ms=lambda: 0, max_absent=3)
    for i in range(10):
        v.removed(f"x{i}", Version(1, 1))
        v.newer(f"y{i}", "mark", Version(1, 1))  # a word of an engine never added
    assert set(v.records) == {"a", "y8", "x9", "y9"}
    v.removed("a", Version(2, 1))  # the file's engine, removed: a tombstone like others
    assert "a" in v.records and len(v.records) == 3
    with pytest.raises(ValueError, match="max_absent"):
        EngineVersions([], 0, max_absent=0)


def test_the_files_engines_start_at_the_origin() -> None:
    v = EngineVersions(["a"], worker=0, clock_ms=lambda: 0)
    assert v.records["a"].life == ORIGIN and v.records["a"].present
    assert v.newer("a", "life", Version(1, 0))  # any versioned change is above it


# ---- any order of delivery, the same tables ----

WORKERS = 4
"""Events come from workers 0..2; each simulated receiver is worker 3 (its own)."""
RECEIVERS = 3
NAMES = ["a", "b", "c", "d"]
"""``a`` and ``b`` are the file's, ``c`` and ``d`` added; any of them may be removed, also
the model's last engine (an admin call may not remove it, but a peer's removal, ordered
after what it won over, is applied as is)."""


def _config(tmp: Path) -> object:
    data = {"router": {"policy": "round_robin", "port": 8000, "workers": WORKERS,
                       "sync_dir": str(tmp)},
            "engines": [_entry(tmp, n, p) for n, p in (("a", 9001), ("b", 9002))]}
    return parse_cluster_config(data, "test.toml", tmp)


def _entry(tmp: Path, name: str, port: int) -> dict[str, object]:
    return {"name": name, "url": f"http://127.0.0.1:{port}", "model": "builtin:tiny-a",
            "served_model_name": "tiny-a", "telemetry_endpoint": f"ipc://{tmp}/{name}.t",
            "kv_events_endpoint": f"ipc://{tmp}/{name}.kv"}


_CONFIG = _config(Path("/nonexistent"))


def _event(kind: str, name: str, version: Version, up: bool) -> EngineEvent:
    port = 10000 + version.counter * 8 + version.worker  # one per version: no port clash
    if kind == "mark":
        return Marked(name, version, up, f"r{version.counter}.{version.worker}")
    if kind == "move":
        return Moved(name, version, f"http://127.0.0.1:{port}")
    if kind == "add":
        entry = _entry(Path("/nonexistent"), name, port)
        return Added(name, version, msgspec.json.encode(entry).decode())
    return Removed(name, version)


@st.composite
def event_sets(draw: st.DrawFn) -> list[EngineEvent]:
    """Engine events with distinct versions (counters 1..12, workers 0..2)."""
    versions = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(0, RECEIVERS - 1)),
                             min_size=3, max_size=20, unique=True))
    return [_event(draw(st.sampled_from(["mark", "move", "add", "remove"])),
                   draw(st.sampled_from([*NAMES, "c"])), Version(counter, worker),
                   draw(st.booleans()))
            for counter, worker in versions]


def _table(core: RouterCore) -> dict[str, tuple[str, str | None, str | None, str]]:
    m = core.membership
    return {name: (e.url, e.marked_down, m.nodes.get(name), m.instances[name].model)
            for name, e in core.state.table.engines.items()}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data(), events=event_sets())
def test_any_order_of_delivery_ends_in_the_same_tables(data: st.DataObject,
                                                       events: list[EngineEvent]) -> None:
    encode = msgspec.msgpack.Encoder().encode
    tables = []
    for _ in range(RECEIVERS):
        order = data.draw(st.permutations(events))
        core = RouterCore(_CONFIG, worker=RECEIVERS)  # type: ignore[arg-type]
        peers = core.membership.peers
        assert peers is not None
        for ev in order:
            peers.feed(encode(ev))
        assert peers.malformed == 0
        tables.append(_table(core))
        m = core.membership
        assert set(m.instances) == {i.name for i in m.changes.config.instances()}
    assert tables[1] == tables[0] and tables[2] == tables[0], events
    # and the last writer's: each name as its newest add or remove left it
    for name in NAMES:
        newest = max((e for e in events if isinstance(e, (Added, Removed))
                      and e.instance == name), key=lambda e: e.version, default=None)
        assert (name in tables[0]) == (newest is None and name in ("a", "b")
                                       or isinstance(newest, Added)), (name, events)


def test_a_change_that_overtook_its_add_is_kept() -> None:
    """With three workers a mark or move of an added engine may reach a worker before
    the add (from another worker): it is counted as naming no engine here, and applied by
    the add when that comes."""
    encode = msgspec.msgpack.Encoder().encode
    events = [_event("add", "c", Version(3, 0), True), _event("mark", "c", Version(5, 1), False),
              _event("move", "c", Version(6, 2), True)]
    tables = []
    for order in (events, events[::-1]):
        core = RouterCore(_CONFIG, worker=RECEIVERS)  # type: ignore[arg-type]
        for ev in order:
            core.membership.peers.feed(encode(ev))  # type: ignore[union-attr]
        tables.append(_table(core))
    assert tables[0] == tables[1]
    assert tables[0]["c"][:2] == ("http://127.0.0.1:10050", "r5.1")
    assert core.membership.peers.rejected == 2  # type: ignore[union-attr]


def test_two_adds_of_one_name_at_once_end_with_the_later() -> None:
    """The measured case: two workers add ``c`` at once, each with its own URL; each is
    told of the other's; both keep the one with the higher version."""
    encode = msgspec.msgpack.Encoder().encode
    cores = [RouterCore(_CONFIG, worker=i) for i in (0, 1)]  # type: ignore[arg-type]
    for core in cores:
        core.membership.versions.clock_ms = lambda: 0
    adds = []
    for i, core in enumerate(cores):
        _, version = core.membership.admin_add(_entry(Path("/nonexistent"), "c", 9100 + i))
        adds.append(Added("c", version, msgspec.json.encode(
            _entry(Path("/nonexistent"), "c", 9100 + i)).decode()))
    assert adds[0].version == Version(1, 0) and adds[1].version == Version(1, 1)
    cores[0].membership.peers.feed(encode(adds[1]))  # type: ignore[union-attr]
    cores[1].membership.peers.feed(encode(adds[0]))  # type: ignore[union-attr]
    assert _table(cores[0]) == _table(cores[1])
    assert cores[0].state.table["c"].url == "http://127.0.0.1:9101"
    assert cores[1].membership.peers.stale == 1  # type: ignore[union-attr]


def test_a_stale_peer_change_is_counted_in_metrics() -> None:
    """A peer's change older than the one held is dropped and counted, in ``Peers.stale``
    and in ``/metrics`` (``hetserve_peer_events_total{outcome="stale"}``)."""
    encode = msgspec.msgpack.Encoder().encode
    core = RouterCore(_CONFIG, worker=RECEIVERS)  # type: ignore[arg-type]
    peers = core.membership.peers
    assert peers is not None
    metrics = RouterMetrics(core, "round_robin")

    def stale() -> str:
        return next(line for line in metrics.render().decode().splitlines()
                    if line.startswith('hetserve_peer_events_total{outcome="stale"}'))

    assert stale().endswith(" 0.0")
    peers.feed(encode(Marked("a", Version(5, 1), False, "newer")))
    peers.feed(encode(Marked("a", Version(4, 2), True, "older")))
    assert (peers.applied, peers.stale) == (1, 1)
    assert core.state.table["a"].marked_down == "newer"
    assert stale().endswith(" 1.0")


def test_a_restarted_worker_takes_what_a_peer_holds() -> None:
    """Worker 1 moves ``a``; worker 0 (told of it) marks ``b`` down, removes it and adds
    ``c``. Worker 1 restarts with the file's engines and says ``Hello``: worker 0 sends it
    every register it holds (``State``: worker 1's own move among them), and the
    restarted worker ends with worker 0's table; a third worker skips them."""
    encode = msgspec.msgpack.Encoder().encode
    w0, w1 = (RouterCore(_CONFIG, worker=i) for i in (0, 1))  # type: ignore[arg-type]
    sent: list[bytes] = []
    for core in (w0, w1):
        core.membership.peers.publish = lambda e: sent.append(encode(e))  # type: ignore
    w1.membership.admin_move("a", "http://127.0.0.1:9555")
    w0.membership.peers.feed(sent.pop())  # type: ignore[union-attr]
    w0.membership.admin_mark("b", False, "drain")
    asyncio.run(w0.membership.admin_remove("b"))
    w0.membership.admin_add(_entry(Path("/nonexistent"), "c", 9100))
    w0.membership.admin_mark("c", False, "later")
    sent.clear()
    restarted, third = (RouterCore(_CONFIG, worker=i) for i in (1, 2))  # type: ignore
    w0.membership.peers.feed(encode(Hello(1)))  # type: ignore[union-attr]
    for message in sent:
        restarted.membership.peers.feed(message)  # type: ignore[union-attr]
        third.membership.peers.feed(message)  # type: ignore[union-attr]
    assert _table(restarted) == _table(w0) != _table(third)
    assert _table(restarted)["a"][0] == "http://127.0.0.1:9555" and "b" not in _table(w0)
    assert restarted.membership.peers.joined == {0}  # type: ignore[union-attr]
    assert third.membership.peers.skipped == len(sent)  # type: ignore[union-attr]
