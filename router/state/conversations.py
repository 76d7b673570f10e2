"""What the router remembers of agents that send no program id: the conversations it saw
and the responses engines stored.

``ConversationIndex``: a call's conversation (its messages or input items, in order) as a
chain of prefix digests (``router.admission.programs.conversation_digests``); a call
whose conversation extends one the index holds joins that call's program, on the model
and engine that call went to (a program's first call is remembered here only, not in the
program table, until a second call joins it: ``ClusterState.join``). Only whole
conversations of routed calls are remembered (the next call of an agent re-sends them and
appends the reply and its tool results), and a digest two programs claim is ambiguous: it
matches nothing, so two sessions that began alike never merge.

``ResponseIndex``: the engine that stored each Responses-API response (vLLM keeps it in
that engine's memory), so a call naming it as ``previous_response_id``, or a ``GET`` of
it, goes there.

Both are bounded (least recently used entries leave first) and forget entries idle for
longer than their TTL; the router's own workers each keep their own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, NamedTuple, Sequence, TypeVar

V = TypeVar("V")


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    last_used: float


class _Bounded(Generic[V]):
    """key -> value, at most ``max_entries`` (least recently used out first), each
    forgotten ``ttl_s`` after its last use."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        if max_entries < 1 or not ttl_s > 0:
            raise ValueError(f"need max_entries >= 1 and ttl_s > 0, got {max_entries}, "
                             f"{ttl_s}")
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._entries: OrderedDict[bytes | str, _Entry[V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes | str, now: float) -> _Entry[V] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now - entry.last_used > self.ttl_s:
            del self._entries[key]
            return None
        entry.last_used = now
        self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes | str, value: V, now: float) -> None:
        self._entries[key] = _Entry(value, now)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def expire(self, now: float) -> None:
        """Forget the entries idle longer than the TTL (oldest first: stop at a fresh
        one)."""
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.last_used <= self.ttl_s:
                return
            del self._entries[key]


class Turn(NamedTuple):
    """A routed call of a conversation: its program, and the model and engine it went
    to."""

    program_id: str
    model: str
    engine: str


class ConversationIndex:
    """Prefix digest of a routed call's whole conversation -> that call (None:
    ambiguous, claimed by two programs)."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self._table: _Bounded[Turn | None] = _Bounded(max_entries, ttl_s)

    def __len__(self) -> int:
        return len(self._table)

    def find(self, digests: Sequence[bytes], now: float) -> Turn | None:
        """The call of the longest proper prefix of a conversation (``digests[k]``: its
        first k + 1 items) that a routed call sent whole, None if none or ambiguous."""
        for digest in reversed(digests[:-1]):
            entry = self._table.get(digest, now)
            if entry is not None:
                return entry.value
        return None

    def remember(self, digest: bytes, turn: Turn, now: float) -> None:
        """``turn`` sent the conversation whose whole digest is ``digest``."""
        entry = self._table.get(digest, now)
        if entry is None:
            self._table.put(digest, turn, now)
        elif entry.value is not None and entry.value.program_id != turn.program_id:
            entry.value = None

    def expire(self, now: float) -> None:
        self._table.expire(now)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """Where a stored response lives, the program whose call made it, and whose it is."""

    engine: str
    model: str
    program_id: str | None
    owner: bytes
    """The caller's tenant (``router.admission.programs.scope`` of its API key): only it
    may continue, read or delete the response."""


class ResponseIndex:
    """Response id -> the engine that stored it."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self._table: _Bounded[StoredResponse] = _Bounded(max_entries, ttl_s)

    def __len__(self) -> int:
        return len(self._table)

    def find(self, response_id: str, owner: bytes, now: float) -> StoredResponse | None:
        """The response, if ``owner``'s (another tenant's is as unknown as none)."""
        entry = self._table.get(response_id, now)
        return None if entry is None or entry.value.owner != owner else entry.value

    def stored(self, response_id: str, where: StoredResponse, now: float) -> None:
        self._table.put(response_id, where, now)

    def expire(self, now: float) -> None:
        self._table.expire(now)
