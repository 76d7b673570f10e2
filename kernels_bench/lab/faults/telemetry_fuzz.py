"""``python -m kernels_bench fuzz-telemetry``: the router's telemetry plane against garbage.

A real ``RouterCore`` (round_robin, with its own ``StreamSubscriber``s and decoders) runs
on a resolved two-engine cluster config with no engine behind it: ``e0`` publishes on
``ipc://`` endpoints (the publisher binds, the router connects), ``e1`` on loopback TCP
(the router binds). This tool's PUB sockets play both engines' snapshot and KV event
publishers, one *lane* per (stream, engine). Loopback only, bounded by ``--frames``.

1. before: valid frames on every lane.
2. fuzz: ``--frames`` garbage frames on random lanes (``MUTATIONS``: wrong part counts,
   random bytes, bad sequence fields, negative, huge and stale sequence numbers, topics
   that are not UTF-8 or no engine's, truncated, extended and bit-flipped msgpack, wrong
   types, nesting 10..100,000 deep, numbers out of bounds (NaN, infinity, negative
   counts, 2**64-1, block_size 0), and parts over ``MAX_MESSAGE_BYTES``: one per 25,000,
   at least one per lane), interleaved with valid frames. A garbage frame that could
   decode is always followed by a valid frame of its lane: two frames agreeing on a new
   sequence are a resync by design (phase 3). Valid frames carry well-typed oddities that
   must not poison state (bytes block hashes, events for other media and groups, counts
   at their bound).
3. resync: the sequence rule's scenarios on every lane: one spoofed 2**63-1, a duplicate
   and a stale frame (all dropped, nothing moves); two consistent spoofed frames (adopted,
   then the real stream back within two frames); a restart at 0; a restart whose frame 0
   was lost; a consistent jump beyond ``MAX_SEQ_JUMP``.
4. after: valid frames again.

After every phase: no exception escaped (a loop exception handler counts them), every
receive loop is alive, no state update failed, each engine's table entry is the last valid
snapshot and its KV index holds exactly the valid blocks, and ``route()`` works. After the
fuzz phase also: every garbage frame was dropped (malformed + unknown topic + out of order
= garbage sent, oversize parts aside: ZeroMQ drops their connection and it is made
again) and every valid frame was applied or counted lost (lost only while a dropped lane
reconnects).
A table goes to stdout, JSON to ``--out``; the exit status is 1 if a check failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import platform
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgspec
import zmq

from engine_ext.telemetry import (MAX_SEQ_JUMP, BlockRemoved, BlockStored, FinishedRequest,
                                  KVEvent, KVEventBatch, SchedulerSnapshot, StreamStats,
                                  encode_snapshot, publisher_binds)
from router.config.cluster import ClusterConfig, parse_cluster_config
from router.dispatch.core import RouterCore
from router.dispatch.subscriber import MAX_MESSAGE_BYTES
from router.state.kv_hash import external_hash
from router.types import RoutingRequest

MUTATIONS = ("parts", "random", "random_payload", "seq_field", "negative_seq", "huge_seq",
             "stale_seq", "bad_topic", "unknown_topic", "id_mismatch", "truncated",
             "extended", "bitflip", "wrong_types", "deep", "out_of_bounds")
"""Garbage kinds, drawn uniformly (``oversize`` parts are placed evenly, not drawn)."""

DECODABLE = frozenset({"random_payload", "huge_seq", "stale_seq", "bitflip", "deep"})
"""Kinds that may decode (then only the sequence rule drops them): a valid frame of the
lane follows each, so no two of them agree on a new sequence."""

OVERSIZE_EVERY = 25_000
VALID_SHARE = 0.25
"""Chance of a valid frame after any other garbage frame."""
CHUNK = 500
"""Frames sent between two syncs (every lane's next frame seen by the router)."""
SETTLE_TIMEOUT_S = 10.0
BLOCK = 16
MAX_SEQ = (1 << 63) - 1
BAD_SEQ_LENGTHS = (*range(8), *range(9, 17))
NEST = "@@nest@@"


@dataclass
class Lane:
    """One (stream, engine) publisher and what the router should hold from it."""

    stream: str
    """``snapshot`` or ``kv``."""
    engine: str
    sock: zmq.Socket
    seq: int = 0
    """The next valid sequence number."""
    last: SchedulerSnapshot | None = None
    """Last valid snapshot sent that the router should apply."""
    blocks: dict[int, int | bytes] = field(default_factory=dict)
    """External hash -> hash as sent, of the valid blocks the index should hold."""

    @property
    def name(self) -> str:
        return f"{self.stream}/{self.engine}"

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    checks: dict[str, bool] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks[name] = self.checks.get(name, True) and ok
        if not ok:
            self.failures.append(f"{name}: {detail}" if detail else name)


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


class Fuzzer:
    def __init__(self, core: RouterCore, lanes: list[Lane], seed: int) -> None:
        self.core, self.lanes = core, lanes
        self.rng = random.Random(seed)
        self.escaped: list[str] = []
        """What the event loop's exception handler saw."""
        self.sent: Counter[str] = Counter()
        self.stuck = False
        """A wait timed out (the router stopped taking frames): later waits fail at once."""
        self._n = 0

    def on_loop_exception(self, _: asyncio.AbstractEventLoop, ctx: dict[str, Any]) -> None:
        self.escaped.append(f"{ctx.get('message')}: {ctx.get('exception')!r}")

    # ---- payloads ----

    def _fresh(self) -> int:
        self._n += 1
        return self._n

    def snapshot(self, lane: Lane, seq: int, garbage: bool = False) -> SchedulerSnapshot:
        r = self.rng
        edge = r.random() < 0.05  # counts at their bound are still valid
        return SchedulerSnapshot(
            engine_id=lane.engine, seq=seq, ts=time.time(), step=seq,
            batch_size=999_999 if garbage else 2**53 if edge else r.randrange(64),
            num_waiting=r.randrange(64), queued_prefill_tokens=r.randrange(10**5),
            pending_decode_tokens=r.randrange(10**5), kv_usage=1.0 if edge else r.random(),
            num_preemptions=r.randrange(10), heartbeat=r.random() < 0.1,
            finished=[FinishedRequest(f"chatcmpl-x{r.randrange(10**6)}-0123abcd",
                                      r.randrange(100), "stop")
                      for _ in range(r.randrange(3))])

    def kv_batch(self, lane: Lane, apply: bool) -> KVEventBatch:
        """Fresh valid blocks (ints or 32-byte digests), maybe the removal of a held one,
        maybe events the index ignores (CPU medium, KV cache group 1)."""
        r = self.rng
        hashes: list[int | bytes] = [
            hashlib.sha256(b"%d" % self._fresh()).digest() if r.random() < 0.3
            else self._fresh() << 8 for _ in range(r.randint(1, 4))]
        events: list[KVEvent] = [BlockStored(
            block_hashes=hashes, parent_block_hash=None, block_size=BLOCK,
            token_ids=[r.randrange(150_000) for _ in range(BLOCK * len(hashes))],
            medium=r.choice((None, "GPU")))]
        if r.random() < 0.1:
            elsewhere = r.choice(({"medium": "CPU"}, {"group_idx": 1}))
            events.append(BlockStored(block_hashes=[self._fresh() << 8], parent_block_hash=None,
                                      token_ids=[], block_size=BLOCK, **elsewhere))
        removed: int | None = None
        if lane.blocks and r.random() < 0.3:
            removed = next(reversed(lane.blocks))
            events.append(BlockRemoved(block_hashes=[lane.blocks[removed]]))
        if apply:
            lane.blocks.update((external_hash(h), h) for h in hashes)
            if removed is not None:
                del lane.blocks[removed]
        return KVEventBatch(ts=time.time(), events=events)

    def valid(self, lane: Lane, apply: bool = True, probe: bool = False) -> list[bytes]:
        """The lane's next valid frame. ``apply``: the router should apply it (else the
        sequence rule will drop it). A KV ``probe`` changes nothing, so losing it does
        not matter."""
        seq, lane.seq = lane.seq, lane.seq + 1
        if lane.stream == "snapshot":
            snap = self.snapshot(lane, seq)
            if apply:
                lane.last = snap
            payload = encode_snapshot(snap)
        else:
            batch = (KVEventBatch(ts=time.time(), events=[]) if probe
                     else self.kv_batch(lane, apply))
            payload = msgspec.msgpack.encode(batch)
        self.sent["valid"] += 1
        return [lane.engine.encode(), _seq(seq), payload]

    def garbage_payload(self, lane: Lane) -> bytes:
        """A well-formed payload whose content must never reach the router's state."""
        if lane.stream == "snapshot":
            return encode_snapshot(self.snapshot(lane, 0, garbage=True))
        return msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[BlockStored(
            block_hashes=[(1 << 62) | self._fresh()], parent_block_hash=None,
            token_ids=[1] * BLOCK, block_size=BLOCK)]))

    def garbage_builtins(self, lane: Lane) -> Any:
        """A garbage payload as builtins: the snapshot's dict, the KV batch's array."""
        return msgspec.msgpack.decode(self.garbage_payload(lane))

    # ---- garbage ----

    def mutant(self, kind: str, lane: Lane) -> list[bytes]:
        r = self.rng
        topic, dup = lane.engine.encode(), _seq(lane.seq - 1)
        payload = self.garbage_payload(lane)
        if kind == "parts":
            return [topic, dup, payload, r.randbytes(r.randrange(32)), b""][
                :r.choice((1, 2, 4, 5))]
        if kind == "random":
            return [r.randbytes(r.randrange(16)), r.randbytes(r.choice(BAD_SEQ_LENGTHS)),
                    r.randbytes(r.randrange(256))]
        if kind == "random_payload":
            return [topic, dup, r.randbytes(r.randrange(256))]
        if kind == "seq_field":
            return [topic, r.randbytes(r.choice(BAD_SEQ_LENGTHS)), payload]
        if kind == "negative_seq":
            return [topic, _seq(-r.randint(1, 2**63)), payload]
        if kind == "huge_seq":
            seq = MAX_SEQ if r.random() < 0.3 else r.randint(lane.seq + MAX_SEQ_JUMP, MAX_SEQ)
            return [topic, _seq(seq), payload]
        if kind == "stale_seq":  # 1..last (0 would be a restart, phase 3)
            return [topic, _seq(r.randint(1, lane.seq - 1)), payload]
        if kind == "bad_topic":
            return [b"\xff" + r.randbytes(r.randrange(8)), dup, payload]
        if kind == "unknown_topic":
            name = f"zz{r.randrange(10**9)}"
            if lane.stream == "snapshot":
                payload = encode_snapshot(msgspec.structs.replace(
                    self.snapshot(lane, 0, garbage=True), engine_id=name))
            return [name.encode(), dup, payload]
        if kind == "id_mismatch":  # snapshots: another engine's id; KV: the topic's case
            if lane.stream == "kv":
                return [topic.upper(), dup, payload]
            other = "e1" if lane.engine == "e0" else "e0"
            return [topic, dup, encode_snapshot(msgspec.structs.replace(
                self.snapshot(lane, 0, garbage=True), engine_id=other))]
        if kind == "truncated":
            return [topic, dup, payload[:r.randrange(len(payload))]]
        if kind == "extended":
            return [topic, dup, payload + r.randbytes(r.randint(1, 64))]
        if kind == "bitflip":
            data = bytearray(payload)
            for _ in range(r.randint(1, 4)):
                data[r.randrange(len(data))] = r.randrange(256)
            return [topic, dup, bytes(data)]
        if kind == "wrong_types":
            return [topic, dup, msgspec.msgpack.encode(self.wrong_types(lane))]
        if kind == "deep":
            return [topic, dup, self.deep(lane)]
        if kind == "out_of_bounds":
            return [topic, dup, msgspec.msgpack.encode(self.out_of_bounds(lane))]
        raise ValueError(f"unknown mutation {kind!r}")

    def wrong_types(self, lane: Lane) -> Any:
        """A field of the wrong type (or a required one missing)."""
        r = self.rng
        obj = self.garbage_builtins(lane)
        if lane.stream == "kv":
            ts, (event,) = obj[0], obj[1]
            return r.choice([
                "x", [], [ts], ["x", [event]], [ts, "x"], [ts, [1]], [ts, [{"type": "Nope"}]],
                [ts, [{**event, "block_hashes": "x"}]], [ts, [{**event, "block_size": "16"}]],
                [ts, [{"type": "BlockRemoved"}]]])
        key = r.choice(sorted(obj))
        if r.random() < 0.2 and key not in ("version", "finished", "heartbeat"):
            del obj[key]
            return obj
        if key == "finished":
            obj[key] = r.choice(["x", [1], [["id", "x", "stop"]], [{"request_id": "a"}]])
        else:  # a float field takes an int, so ints are wrong only for the others
            numbers = (True,) if key in ("ts", "kv_usage") else (1.5, 1)
            obj[key] = r.choice([b"x", [1], {"a": 1}, None, *numbers])
        return obj

    def out_of_bounds(self, lane: Lane) -> Any:
        """Well-typed, absurd numbers: NaN, infinity, negative counts, 2**64-1, ..."""
        r = self.rng
        obj = self.garbage_builtins(lane)
        if lane.stream == "kv":
            obj[1][0]["block_size"] = r.choice((0, -16, -(2**63)))
            return obj
        key, value = r.choice([
            ("batch_size", -1), ("num_waiting", 2**64 - 1), ("step", -(2**63)),
            ("queued_prefill_tokens", 2**53 + 1), ("pending_decode_tokens", -5),
            ("num_preemptions", 2**63 - 1), ("kv_usage", math.nan), ("kv_usage", math.inf),
            ("kv_usage", -0.5), ("kv_usage", 1.5), ("ts", math.nan), ("ts", -1.0),
            ("ts", -math.inf), ("ts", math.inf), ("finished", [["id", -3, "stop"]])])
        obj[key] = value
        return obj

    def deep(self, lane: Lane) -> bytes:
        """Nesting 10..100,000 deep: in a KV batch's ``extra_keys`` (typed ``Any``, so the
        decoder recurses until RecursionError, or accepts a shallow one) or as the
        payload itself (arrays, or maps under an unknown key)."""
        depth = int(10 ** self.rng.uniform(1, 5))
        if lane.stream == "kv" and self.rng.random() < 0.7:
            obj = self.garbage_builtins(lane)
            obj[1][0]["extra_keys"] = [NEST]
            return msgspec.msgpack.encode(obj).replace(msgspec.msgpack.encode(NEST),
                                                       b"\x91" * depth + b"\xc0")
        return (b"\x91" if self.rng.random() < 0.5 else b"\x81\xa1k") * depth + b"\xc0"

    # ---- the router's side ----

    def stats(self, lane: Lane) -> StreamStats:
        membership = self.core.membership
        sub = membership.snapshots if lane.stream == "snapshot" else membership.kv_events
        return sub.decoder.stats.get(lane.engine) or StreamStats()

    def dropped(self) -> int:
        s = self.core.membership.stats
        return (s.malformed_snapshot_frames + s.malformed_kv_frames + s.unknown_topic_frames
                + s.out_of_order_snapshot_frames + s.out_of_order_kv_frames)

    async def until(self, cond: Callable[[], bool], timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if self.stuck or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.001)
        return True

    async def sync(self, phase: Phase) -> None:
        """Send each lane probes until the router has seen one (lost probes are gaps)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        for lane in self.lanes:
            while True:
                seq = lane.seq
                lane.send(self.valid(lane, probe=True))
                if await self.until(lambda: self.stats(lane).last_seq == seq, 0.25):
                    break
                if self.stuck or time.monotonic() > deadline:
                    phase.check("router sees every lane", False, lane.name)
                    self.stuck = True
                    break

    def check_state(self, phase: Phase) -> None:
        core = self.core
        membership = core.membership
        loops = [t for sub in (membership.snapshots, membership.kv_events) for t in sub.tasks]
        dead = [f"{t.get_name()}: {None if t.cancelled() else t.exception()!r}"
                for t in loops if t.done()]
        phase.check("receive loops alive", len(loops) == len(self.lanes) and not dead,
                    "; ".join(dead))
        phase.check("no escaped exception", not self.escaped, "; ".join(self.escaped[:3]))
        stats = core.membership.stats
        errors = stats.failed_snapshot_frames + stats.failed_kv_frames
        phase.check("no failed state update", errors == 0, f"{errors} failed")
        for lane in self.lanes:
            e = core.state.table[lane.engine]
            if lane.stream == "snapshot":
                phase.check("table = last valid snapshot", e.snapshot == lane.last, lane.name)
                phase.check("engines up", e.down_reason is None,
                            f"{lane.name}: {e.down_reason}")
            else:
                held = len(e.kv) == len(lane.blocks) and all(h in e.kv for h in lane.blocks)
                phase.check("KV index = valid blocks", held, f"{lane.name}: {len(e.kv)} "
                            f"held, {len(lane.blocks)} expected")

    async def check_route(self, phase: Phase) -> None:
        req = RoutingRequest(request_id=f"r{self._fresh()}", requested_model=None,
                             prompt_token_ids=list(range(4 * BLOCK)),
                             num_prompt_tokens=4 * BLOCK, max_tokens=8)
        try:
            self.core.routing.on_complete(await self.core.routing.route(req), 8, None)
            phase.check("route() works", True)
        except Exception as exc:
            phase.check("route() works", False, repr(exc))

    # ---- phases ----

    async def steady(self, phase: Phase, rounds: int) -> None:
        await self.sync(phase)
        for _ in range(rounds):
            for lane in self.lanes:
                lane.send(self.valid(lane))
        await self.sync(phase)

    async def fuzz(self, phase: Phase, n: int) -> dict[str, Any]:
        r = self.rng
        oversize = max(len(self.lanes), n // OVERSIZE_EVERY)
        oversize_at = {int((k + 0.5) * n / oversize): self.lanes[k % len(self.lanes)]
                       for k in range(oversize)}
        start = {lane.name: (lane.seq, self.stats(lane).received, self.stats(lane).gaps,
                             self.stats(lane).resyncs) for lane in self.lanes}
        valid0, dropped0 = self.sent["valid"], self.dropped()
        for chunk in range(0, n, CHUNK):
            if self.stuck:
                break
            for i in range(chunk, min(n, chunk + CHUNK)):
                if i in oversize_at:  # ZeroMQ drops the connection: sync around it
                    lane = oversize_at[i]
                    await self.sync(phase)
                    lane.send([lane.engine.encode(), _seq(lane.seq - 1),
                               bytes(MAX_MESSAGE_BYTES + 1)])
                    self.sent["oversize"] += 1
                    await self.sync(phase)
                    continue
                lane, kind = r.choice(self.lanes), r.choice(MUTATIONS)
                lane.send(self.mutant(kind, lane))
                self.sent[kind] += 1
                if kind in DECODABLE or r.random() < VALID_SHARE:
                    lane.send(self.valid(lane))
            await self.sync(phase)
        garbage = sum(self.sent[k] for k in MUTATIONS)
        dropped = self.dropped() - dropped0
        phase.check("every garbage frame dropped", dropped == garbage,
                    f"{dropped} dropped of {garbage}")
        lost = 0
        for lane in self.lanes:
            st = self.stats(lane)
            seq0, received0, gaps0, resyncs0 = start[lane.name]
            lost += st.gaps - gaps0
            phase.check("no resync", st.resyncs == resyncs0, lane.name)
            phase.check("valid frames applied or counted lost",
                        st.received - received0 + st.gaps - gaps0 == lane.seq - seq0,
                        lane.name)
        return {"garbage": garbage, "dropped": dropped, "oversize": self.sent["oversize"],
                "valid": self.sent["valid"] - valid0, "valid_lost": lost}

    async def resync(self, phase: Phase) -> None:
        """The sequence rule's scenarios, on every lane."""
        for lane in self.lanes:
            await self._resync_lane(phase, lane)

    async def _resync_lane(self, phase: Phase, lane: Lane) -> None:
        st = self.stats(lane)
        gaps0, resyncs0 = st.gaps, st.resyncs

        async def settle(received: int, out_of_order: int, what: str) -> None:
            ok = await self.until(lambda: st.received >= received
                                  and st.out_of_order >= out_of_order)
            self.stuck |= not ok
            phase.check("scenario settles", ok, f"{lane.name}: {what}")
            self.check_state(phase)

        def spoof(seq: int) -> list[bytes]:
            return [lane.engine.encode(), _seq(seq), self.garbage_payload(lane)]

        # one spoofed 2**63-1, a duplicate, a stale frame: each dropped, the next real one
        # taken, nothing moves
        for seq in (MAX_SEQ, lane.seq - 1, max(1, lane.seq // 2)):
            received, out_of_order = st.received, st.out_of_order
            lane.send(spoof(seq))
            lane.send(self.valid(lane))
            await settle(received + 1, out_of_order + 1, f"one spoofed frame, seq {seq}")
        phase.check("single frames move nothing", st.resyncs == resyncs0, lane.name)

        # two consistent spoofed frames: adopted (by design); the real stream, now behind,
        # is back at its second frame, which clears the KV index (a step back = restart)
        received, out_of_order = st.received, st.out_of_order
        first, second = spoof(1 << 62), spoof((1 << 62) + 1)
        if lane.stream == "snapshot":
            lane.last = msgspec.msgpack.decode(second[2], type=SchedulerSnapshot)
        else:
            stored = msgspec.msgpack.decode(second[2], type=KVEventBatch).events[0]
            assert isinstance(stored, BlockStored)
            lane.blocks.update((external_hash(h), h) for h in stored.block_hashes)
        lane.send(first)
        lane.send(second)
        await settle(received + 1, out_of_order + 1, "two consistent spoofed frames")
        lane.send(self.valid(lane, apply=False))
        lane.blocks.clear()
        lane.send(self.valid(lane))
        await settle(received + 2, out_of_order + 2, "the real stream after them")

        # a restart at 0: taken at once; a restart whose frame 0 was lost: at frame 2
        received, out_of_order = st.received, st.out_of_order
        lane.seq = 0
        lane.blocks.clear()
        for _ in range(8):
            lane.send(self.valid(lane))
        await settle(received + 8, out_of_order, "restart at 0")
        lane.seq = 3
        lane.send(self.valid(lane, apply=False))
        lane.blocks.clear()
        lane.send(self.valid(lane))
        await settle(received + 9, out_of_order + 1, "restart whose frame 0 was lost")

        # a consistent jump beyond MAX_SEQ_JUMP: a resync at its second frame, no gaps
        lane.seq += MAX_SEQ_JUMP + 10
        lane.send(self.valid(lane, apply=False))
        lane.send(self.valid(lane))
        await settle(received + 10, out_of_order + 2, "a jump beyond MAX_SEQ_JUMP")
        phase.check("resyncs as the rule says", st.resyncs - resyncs0 == 5,
                    f"{lane.name}: {st.resyncs - resyncs0} resyncs, expected 5")
        phase.check("no gaps from resyncs", st.gaps == gaps0, f"{lane.name}: "
                    f"{st.gaps - gaps0} gaps")


def cluster_config(tmp: Path) -> ClusterConfig:
    """A resolved cluster config: e0 on ipc:// endpoints, e1 on loopback TCP ports."""
    with zmq.Context() as ctx:
        ports = []
        for _ in range(2):
            with ctx.socket(zmq.REP) as s:
                ports.append(s.bind_to_random_port("tcp://127.0.0.1"))
    engines = [
        {"name": "e0", "url": "http://127.0.0.1:9", "telemetry_endpoint": f"ipc://{tmp}/t0",
         "kv_events_endpoint": f"ipc://{tmp}/k0"},
        {"name": "e1", "url": "http://127.0.0.1:10",
         "telemetry_endpoint": f"tcp://127.0.0.1:{ports[0]}",
         "kv_events_endpoint": f"tcp://127.0.0.1:{ports[1]}"}]
    # heartbeat timeout: every lane gets a frame per chunk; 30 s spares a loaded machine
    router = {"policy": "round_robin", "heartbeat_timeout_s": 30.0}
    return parse_cluster_config({"router": router, "engines": engines}, "<telemetry-fuzz>",
                                tmp)


class _CountWarnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1


async def fuzz_router(frames: int, seed: int) -> dict[str, Any]:
    """Run the four phases against a real ``RouterCore``; the report as a dict."""
    tmp = Path(tempfile.mkdtemp(prefix="hetserve-fuzz-"))
    cfg = cluster_config(tmp)
    core = RouterCore(cfg)
    pub_ctx = zmq.Context()
    warnings = _CountWarnings()
    router_log = logging.getLogger("hetserve.router")
    router_log.addHandler(warnings)
    lanes: list[Lane] = []
    try:
        await core.start()
        for inst in cfg.instances():
            for stream, ep in (("snapshot", inst.telemetry_endpoint),
                               ("kv", inst.kv_events_endpoint)):
                sock = pub_ctx.socket(zmq.PUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 0)  # drop nothing: the syncs bound the queue
                (sock.bind if publisher_binds(ep) else sock.connect)(ep)
                lanes.append(Lane(stream, inst.name, sock))
        fuzzer = Fuzzer(core, lanes, seed)
        asyncio.get_running_loop().set_exception_handler(fuzzer.on_loop_exception)
        phases: list[Phase] = []
        fuzz_counts: dict[str, Any] = {}
        for name in ("before", "fuzz", "resync", "after"):
            phase = Phase(name)
            phases.append(phase)
            t0 = time.perf_counter()
            if name == "fuzz":
                fuzz_counts = await fuzzer.fuzz(phase, frames)
            elif name == "resync":
                await fuzzer.resync(phase)
            else:
                await fuzzer.steady(phase, 50)
            phase.seconds = time.perf_counter() - t0
            fuzzer.check_state(phase)
            await fuzzer.check_route(phase)
        return report(frames, seed, fuzzer, phases, fuzz_counts, warnings.lines)
    finally:
        router_log.removeHandler(warnings)
        with contextlib.suppress(Exception):  # a dead receive loop's error, reported above
            await core.stop()
        for lane in lanes:
            lane.sock.close(linger=0)
        pub_ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)


def report(frames: int, seed: int, fuzzer: Fuzzer, phases: list[Phase],
           fuzz_counts: dict[str, Any], warning_lines: int) -> dict[str, Any]:
    s = fuzzer.core.membership.stats
    seconds = next(p.seconds for p in phases if p.name == "fuzz")
    return {
        "meta": {"frames": frames, "seed": seed, "python": platform.python_version(),
                 "machine": platform.machine(), "cpus": os.cpu_count(),
                 "load_avg": os.getloadavg(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                 "max_message_bytes": MAX_MESSAGE_BYTES, "max_seq_jump": MAX_SEQ_JUMP},
        "sent": dict(sorted(fuzzer.sent.items())),
        "fuzz": {**fuzz_counts, "seconds": seconds,
                 "garbage_per_s": fuzz_counts["garbage"] / seconds,
                 "frames_per_s": (fuzz_counts["garbage"] + fuzz_counts["valid"]) / seconds},
        "router": {
            "malformed": {"snapshot": s.malformed_snapshot_frames, "kv": s.malformed_kv_frames},
            "unknown_topic": s.unknown_topic_frames,
            "out_of_order": {"snapshot": s.out_of_order_snapshot_frames,
                             "kv": s.out_of_order_kv_frames},
            "failed_updates": {"snapshot": s.failed_snapshot_frames, "kv": s.failed_kv_frames},
            "lanes": {lane.name: {k: getattr(fuzzer.stats(lane), k) for k in
                                  ("received", "gaps", "resyncs", "out_of_order")}
                      for lane in fuzzer.lanes},
            "warning_lines": warning_lines},
        "escaped_exceptions": fuzzer.escaped,
        "phases": [asdict(p) for p in phases],
        "ok": not fuzzer.escaped and all(all(p.checks.values()) for p in phases),
    }


def print_report(rep: dict[str, Any]) -> None:
    print(f"{'phase':8} {'seconds':>8}  checks")
    for p in rep["phases"]:
        passed = sum(p["checks"].values())
        print(f"{p['name']:8} {p['seconds']:>8.2f}  {passed}/{len(p['checks'])} passed"
              + "".join(f"\n{'':18}FAILED {f}" for f in p["failures"][:5]))
    print(f"\n{'frames sent':16} {'count':>8}")
    for kind, n in rep["sent"].items():
        print(f"{kind:16} {n:>8}")
    f, r = rep["fuzz"], rep["router"]
    print(f"\nfuzz: {f['garbage']} garbage + {f['valid']} valid frames in {f['seconds']:.1f} s"
          f" = {f['garbage_per_s']:.0f} garbage frames/s ({f['frames_per_s']:.0f} frames/s);"
          f" {f['dropped']} dropped, {f['oversize']} oversize parts refused by ZeroMQ, "
          f"{f['valid_lost']} valid frames lost while reconnecting")
    print(f"router: malformed {r['malformed']}, unknown topic {r['unknown_topic']}, "
          f"out of order {r['out_of_order']}, failed updates {r['failed_updates']}, "
          f"{r['warning_lines']} warning lines")
    print(f"{'lane':14} {'applied':>8} {'lost':>6} {'resyncs':>8} {'out of order':>13}")
    for name, lane in r["lanes"].items():
        print(f"{name:14} {lane['received']:>8} {lane['gaps']:>6} {lane['resyncs']:>8} "
              f"{lane['out_of_order']:>13}")
    print(f"escaped exceptions: {len(rep['escaped_exceptions'])}; "
          f"{'all checks passed' if rep['ok'] else 'CHECKS FAILED'}")


def run(frames: int, seed: int = 0) -> dict[str, Any]:
    return asyncio.run(fuzz_router(frames, seed))
