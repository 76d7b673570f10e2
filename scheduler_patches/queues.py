"""A vLLM ``RequestQueue`` ordered by a key that only changes when told.

Each entry sits in one heap with the key it had when pushed. A key change is a
``rekey(request)``: a new entry is pushed and the old one becomes stale (lazy deletion),
so no key ever changes under an item inside the heap. Stale entries are skipped on
pop/peek and the heap is compacted when they outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

KeyFn = Callable[[Request], tuple[Any, ...]]


class KeyedRequestQueue(RequestQueue):
    """Waiting queue served in ascending ``key_fn(request)`` order.

    ``prepend_request(s)`` (used by vLLM for preempted and skipped requests) inserts by
    key as well: in a keyed queue there is no front to prepend to, as in vLLM's own
    ``PriorityRequestQueue``.
    """

    def __init__(self, key_fn: KeyFn) -> None:
        self._key_fn = key_fn
        self._heap: list[tuple[tuple[Any, ...], int, Request]] = []
        # request_id -> (sequence number of its live heap entry, request)
        self._live: dict[str, tuple[int, Request]] = {}
        self._seq = itertools.count()

    # -- RequestQueue API --
    def add_request(self, request: Request) -> None:
        seq = next(self._seq)
        self._live[request.request_id] = (seq, request)
        heapq.heappush(self._heap, (self._key_fn(request), seq, request))

    def pop_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("pop from an empty queue")
        _, _, request = heapq.heappop(self._heap)
        del self._live[request.request_id]
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
        self._maybe_compact()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._live.pop(request.request_id, None)
        self._maybe_compact()

    def __bool__(self) -> bool:
        return bool(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        live = [item for item in self._heap if self._is_live(item)]
        live.sort(key=lambda item: (item[0], item[1]))
        return (item[2] for item in live)

    def unordered(self) -> Iterator[Request]:
        """The queued requests in no particular order (O(n), no sort)."""
        return (request for _, request in self._live.values())

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
        live = self._live.get(item[2].request_id)
        return live is not None and live[0] == item[1]

    def _drop_stale_top(self) -> None:
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [item for item in self._heap if self._is_live(item)]
            heapq.heapify(self._heap)
