"""Collects concurrent ``route()`` calls into batches for a batched policy.

A batch closes when it holds ``max_batch`` requests or when the window (asked of the
policy when the batch's first request arrives) ends. Batches run one at a time, in
arrival order, so each sees the state its predecessors left.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

from router.types import Decision, RoutingRequest

RunBatch = Callable[[Sequence[RoutingRequest]], Awaitable[Sequence[Decision | Exception]]]


class BatchCollector:
    def __init__(self, run: RunBatch, max_batch: int, window_s: Callable[[], float],
                 abandon: Callable[[Decision], None]) -> None:
        """``abandon`` releases a decision whose caller went away while it was batched."""
        self._run, self.max_batch, self._window_s = run, max_batch, window_s
        self._abandon = abandon
        self._pending: list[tuple[RoutingRequest, asyncio.Future[Decision]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, req: RoutingRequest) -> Decision:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Decision] = loop.create_future()
        self._pending.append((req, fut))
        if len(self._pending) >= self.max_batch:
            self._arm(0.0)
        elif self._timer is None:
            self._arm(self._window_s())
        return await fut

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        async with self._lock:
            batch = [(r, f) for r, f in self._pending[:self.max_batch] if not f.done()]
            del self._pending[:self.max_batch]
            if batch:
                try:
                    results: Sequence[Decision | Exception] = await self._run(
                        [r for r, _ in batch])
                except Exception as exc:  # a predictor failed: every request sees it
                    results = [exc] * len(batch)
                for (_, fut), res in zip(batch, results):
                    if fut.done():
                        if isinstance(res, Decision):
                            self._abandon(res)
                    elif isinstance(res, Exception):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)
            if self._pending and self._timer is None:
                full = len(self._pending) >= self.max_batch
                self._arm(0.0 if full else self._window_s())

    async def stop(self, exc: Exception) -> None:
        """Fail every waiting request with ``exc`` and wait for running batches."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, fut in self._pending:
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
