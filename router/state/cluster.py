"""``ClusterState``: the router state that routing and membership share (no I/O).

The engine table, the in-flight ledger, the program table (and the conversations and
stored responses that find programs), the KV block hasher, the
counters and the requests open on each engine; ``maintain`` ages it on the request path.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Sequence

from router.state.conversations import ConversationIndex, ResponseIndex, Turn
from router.state.engines import EngineTable
from router.state.inflight import InflightLedger
from router.state.kv_hash import BlockHasher
from router.state.programs import ProgramTable
from router.state.stats import RouterStats, StreamCounters
from router.state.view import StateView

EXPIRY_INTERVAL_S = 1.0
"""How often abandoned programs are looked for (on the request path)."""


class ClusterState:
    """The engines as telemetry shows them and the router's own accounting of them."""

    def __init__(self, instances: Sequence[Any], heartbeat_timeout_s: float,
                 stall_timeout_s: float, program_ttl_s: float,
                 scrape_timeout_s: float = 10.0, sole_timeout_s: float = 5.0,
                 wall_clock: Callable[[], float] = time.time,
                 max_programs: int = 65_536) -> None:
        """``instances``: objects with ``name, served_model_name, url, max_model_len``;
        ``max_programs`` bounds the program table and the indexes beside it."""
        self.table = EngineTable(instances, heartbeat_timeout_s, stall_timeout_s,
                                 scrape_timeout_s, sole_timeout_s, wall_clock)
        self.ledger = InflightLedger()
        self.programs = ProgramTable(program_ttl_s, max_programs)
        self.conversations = ConversationIndex(max_programs, program_ttl_s)
        self.responses = ResponseIndex(max_programs, program_ttl_s)
        self.hasher = BlockHasher()
        self.stats = RouterStats(engines={i.name: StreamCounters() for i in instances})
        """Raw counters (``Membership.stats`` adds the subscribers' frame counts)."""
        self.open_requests: Counter[str] = Counter()
        """Requests sent to each engine whose answer has not ended, whatever its marks
        (a down mark releases its load from the ledger, not its requests): what a
        drain waits for."""
        self._next_expiry = 0.0

    def view(self) -> StateView:
        """What a policy reads for one decision or batch."""
        return StateView(self.table, self.ledger, self.programs, self.hasher)

    def join(self, turn: Turn, now: float) -> None:
        """A call joins ``turn``'s program: the program enters the table on the model and
        engine of ``turn`` unless it is there (its first call is remembered by the
        conversation and response indexes only, so one-call programs cost no entry)."""
        if turn.program_id not in self.programs:
            self.programs.routed(turn.program_id, turn.model, now, turn.engine)

    def closed(self, instance: str) -> None:
        """A request open on ``instance`` ended."""
        self.open_requests[instance] -= 1
        if self.open_requests[instance] <= 0:
            del self.open_requests[instance]

    def maintain(self, now: float) -> None:
        """Mark silent engines down (releasing their load) and, once a second, expire
        abandoned programs."""
        self.mark_silent(now)
        if now >= self._next_expiry:
            self._next_expiry = now + EXPIRY_INTERVAL_S
            self.stats.programs_expired += len(self.programs.expire(now))
            self.conversations.expire(now)
            self.responses.expire(now)

    def mark_silent(self, now: float) -> None:
        """Mark engines silent past their timeout down, releasing their load."""
        for name in self.table.refresh(now):
            self.ledger.release_engine(name)
            self.stats.engine_down_events += 1
