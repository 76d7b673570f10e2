"""vLLM ``RequestQueue``s that keep the count of tokens still to prefill, and one
ordered by a key that only changes when told.

Every queue here carries ``pending``, a ``PendingTokens`` ledger updated on each add and
removal, so telemetry reads the queued prefill tokens in O(1) instead of walking a queue
of thousands of requests every snapshot.

``KeyedRequestQueue``: each entry sits in one heap with the key it had when pushed. A key change is a
``rekey(request)``: a new entry is pushed and the old one becomes stale (lazy deletion),
so no key ever changes under an item inside the heap. Stale entries are skipped on
pop/peek and the heap is compacted when they outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    RequestQueue,
)
from vllm.v1.request import Request

KeyFn = Callable[[Request], tuple[Any, ...]]


class PendingTokens:
    """Sum over queued requests of the tokens they still need computed.

    A request's share is fixed when it is queued (``num_tokens - num_computed_tokens``:
    the prompt, plus the output so far for a preempted request, which recomputes it) and
    taken out exactly when it leaves.
    """

    def __init__(self) -> None:
        self.total = 0
        self._by_id: dict[str, int] = {}

    def add(self, request: Request) -> None:
        share = max(0, request.num_tokens - request.num_computed_tokens)
        self.total += share - self._by_id.get(request.request_id, 0)
        self._by_id[request.request_id] = share

    def discard(self, request: Request) -> None:
        self.total -= self._by_id.pop(request.request_id, 0)


class CountingFCFSQueue(FCFSRequestQueue):
    """vLLM's FCFS queue (same order, same prepend semantics) with a ``pending`` ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = PendingTokens()

    def add_request(self, request: Request) -> None:
        self.pending.add(request)
        super().add_request(request)

    def pop_request(self) -> Request:
        request = super().pop_request()
        self.pending.discard(request)
        return request

    def prepend_request(self, request: Request) -> None:
        self.pending.add(request)
        super().prepend_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        for request in requests:
            self.pending.add(request)
        super().prepend_requests(requests)

    def remove_request(self, request: Request) -> None:
        super().remove_request(request)
        self.pending.discard(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        super().remove_requests(requests)
        for request in requests:
            self.pending.discard(request)


class CountingPriorityQueue(PriorityRequestQueue):
    """vLLM's priority queue (same order) with a ``pending`` ledger.

    Its ``prepend_request(s)`` go through ``add_request``, which does the counting.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pending = PendingTokens()

    def add_request(self, request: Request) -> None:
        self.pending.add(request)
        super().add_request(request)

    def pop_request(self) -> Request:
        request = super().pop_request()
        self.pending.discard(request)
        return request

    def remove_request(self, request: Request) -> None:
        super().remove_request(request)
        self.pending.discard(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        super().remove_requests(requests)
        for request in requests:
            self.pending.discard(request)


class KeyedRequestQueue(RequestQueue):
    """Waiting queue served in ascending ``key_fn(request)`` order.

    ``prepend_request(s)`` (used by vLLM for preempted and skipped requests) inserts by
    key as well: in a keyed queue there is no front to prepend to, as in vLLM's own
    ``PriorityRequestQueue``.
    """

    def __init__(self, key_fn: KeyFn) -> None:
        self._key_fn = key_fn
        self._heap: list[tuple[tuple[Any, ...], int, Request]] = []
        self._live: dict[str, int] = {}  # request_id -> sequence number of its live entry
        self._seq = itertools.count()
        self.pending = PendingTokens()

    # -- RequestQueue API --
    def add_request(self, request: Request) -> None:
        seq = next(self._seq)
        self.pending.add(request)
        self._live[request.request_id] = seq
        heapq.heappush(self._heap, (self._key_fn(request), seq, request))

    def pop_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("pop from an empty queue")
        _, _, request = heapq.heappop(self._heap)
        del self._live[request.request_id]
        self.pending.discard(request)
        return request

    def peek_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][2]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        if self._live.pop(request.request_id, None) is None:
            raise ValueError(f"request {request.request_id} is not in the queue")
        self.pending.discard(request)
        self._maybe_compact()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            if self._live.pop(request.request_id, None) is not None:
                self.pending.discard(request)
        self._maybe_compact()

    def __bool__(self) -> bool:
        return bool(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        live = [item for item in self._heap if self._is_live(item)]
        live.sort(key=lambda item: (item[0], item[1]))
        return (item[2] for item in live)

    # -- key changes --
    def __contains__(self, request: object) -> bool:
        return isinstance(request, Request) and request.request_id in self._live

    def rekey(self, request: Request) -> None:
        """Re-insert a queued request under its current key (the old entry goes stale)."""
        if request.request_id in self._live:
            self.add_request(request)
            self._maybe_compact()

    # -- internals --
    def _is_live(self, item: tuple[tuple[Any, ...], int, Request]) -> bool:
        return self._live.get(item[2].request_id) == item[1]

    def _drop_stale_top(self) -> None:
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [item for item in self._heap if self._is_live(item)]
            heapq.heapify(self._heap)
