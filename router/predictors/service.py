"""Asynchronous batched predictor service (Chimera section 3.8).

The router's event loop only builds light ``RequestFeatures`` and enqueues them; a
collector per predictor closes a batch at ``max_batch`` requests or ``max_wait_ms`` after
its first one, and the batch runs in a separate worker process pool (every worker loads
every artifact once), so model inference never blocks the loop. Answers are those of the
predictor's own ``predict`` on the same features: the same as calling it directly.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence

from router.predictors.artifact import ArtifactError
from router.predictors.base import QualityLength
from router.predictors.features import RequestFeatures, from_request
from router.types import Overloaded

if TYPE_CHECKING:
    from router.types import RoutingRequest


@dataclass(frozen=True)
class ServiceSettings:
    max_batch: int = 64
    """A batch closes when it holds this many requests (Chimera section 3.8)..."""
    max_wait_ms: float = 2.0
    """... or this long after its first request arrived."""
    workers: int = 1
    """Worker processes (each holds every artifact; batches run in parallel up to this)."""
    threads_per_worker: int = 1
    """torch threads per worker."""
    max_queue: int = 512
    """Requests waiting for one predictor beyond which new ones are shed (``Overloaded``,
    a 503 to the client): a queue that only grows would make every answer late."""
    inline_max_ms: float = 1.0
    """A predictor whose call on one request costs at most this (the median of a few
    calls timed at start-up, ``loader.placement``) runs in the router process, inside the
    call, instead of behind the pool: it costs the event loop less than the batch window
    (``max_wait_ms``) and the process hop would. 0 sends every predictor to the pool.
    Issue 33; docs/architecture.md, "Where the predictors run"."""


# ---- worker process ----

_LOADED: dict[str, Any] = {}
_FAILED: dict[str, str] = {}


def _init_worker(artifacts: dict[str, str], threads: int) -> None:
    import torch

    from router.predictors.kinds import kind

    torch.set_num_threads(threads)
    for name, path in artifacts.items():
        try:
            _LOADED[name] = kind(name).predictor.load(path)
        except Exception as e:  # reported by _ready(): a failing initializer says nothing
            _FAILED[name] = f"{path!r}: {type(e).__name__}: {e}"


def _predict(name: str, feats: list[RequestFeatures]) -> list[Any]:
    return _LOADED[name].predict(feats)


def _ready() -> list[str]:
    if _FAILED:
        raise ArtifactError("predictor service: cannot load " + "; ".join(
            f"{name} {why}" for name, why in sorted(_FAILED.items())))
    return sorted(_LOADED)


# ---- router process ----


class Collector:
    """Forms batches of one predictor's requests and hands each to ``run_batch``."""

    def __init__(self, run_batch: Callable[[list[RequestFeatures]], Awaitable[list[Any]]],
                 max_batch: int, max_wait_s: float, parallel: int,
                 max_queue: int = ServiceSettings.max_queue) -> None:
        self.run_batch, self.max_batch, self.max_wait_s = run_batch, max_batch, max_wait_s
        self.queue: asyncio.Queue[tuple[RequestFeatures, asyncio.Future[Any]]] = \
            asyncio.Queue(max_queue)
        self.slots = asyncio.Semaphore(parallel)
        self.batches: set[asyncio.Task[None]] = set()
        self.task = asyncio.get_running_loop().create_task(self._collect())

    def put(self, feat: RequestFeatures) -> asyncio.Future[Any]:
        """The future of ``feat``'s prediction; ``Overloaded`` when the queue is full."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait((feat, fut))
        except asyncio.QueueFull:
            raise Overloaded(f"{self.queue.maxsize} requests already wait for a "
                             "predictor") from None
        return fut

    async def _next_batch(self) -> list[tuple[RequestFeatures, asyncio.Future[Any]]]:
        """The next batch of requests still waiting (a cancelled one, whose client left,
        costs no inference)."""
        loop = asyncio.get_running_loop()
        batch: list[tuple[RequestFeatures, asyncio.Future[Any]]] = []
        deadline = None
        while len(batch) < self.max_batch:
            if not self.queue.empty():
                item = self.queue.get_nowait()
            elif deadline is None:
                item = await self.queue.get()
            else:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            if item[1].done():
                continue
            batch.append(item)
            if deadline is None:
                deadline = loop.time() + self.max_wait_s
        return batch

    async def _collect(self) -> None:
        while True:
            batch = await self._next_batch()
            await self.slots.acquire()
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self.batches.add(task)
            task.add_done_callback(self.batches.discard)

    async def _run(self, batch: list[tuple[RequestFeatures, asyncio.Future[Any]]]) -> None:
        try:
            results = await self.run_batch([f for f, _ in batch])
        except Exception as e:  # every waiter gets the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        else:
            for (_, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)
        finally:
            self.slots.release()

    def stop(self) -> None:
        if self.task.get_loop().is_closed():  # its loop ended (and with it every task)
            return
        self.task.cancel()
        for t in self.batches:
            t.cancel()


class PredictorService:
    """Worker pool + one collector per predictor (per event loop)."""

    def __init__(self, artifacts: Mapping[str, str], settings: ServiceSettings) -> None:
        self.settings = settings
        self.names = sorted(artifacts)
        self.pool = ProcessPoolExecutor(
            settings.workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker, initargs=(dict(artifacts), settings.threads_per_worker))
        self._collectors: dict[str, Collector] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start every worker and wait until each has loaded every artifact (a broken
        artifact fails here, at start-up, not on the first request)."""
        for fut in [self.pool.submit(_ready) for _ in range(self.settings.workers)]:
            fut.result()

    def _collector(self, name: str) -> Collector:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._stop_collectors()
            self._loop = loop
        if name not in self._collectors:
            s = self.settings

            async def run(feats: list[RequestFeatures]) -> list[Any]:
                return await loop.run_in_executor(self.pool, _predict, name, feats)

            self._collectors[name] = Collector(run, s.max_batch, s.max_wait_ms / 1e3,
                                               s.workers, s.max_queue)
        return self._collectors[name]

    async def submit(self, name: str, feats: Sequence[RequestFeatures]) -> list[Any]:
        collector = self._collector(name)
        futures = []
        try:
            for f in feats:
                futures.append(collector.put(f))
        except Overloaded:
            for fut in futures:  # all or none of a call's requests are queued
                fut.cancel()
            raise
        return list(await asyncio.gather(*futures))

    def _stop_collectors(self) -> None:
        for c in self._collectors.values():
            c.stop()
        self._collectors.clear()

    def close(self) -> None:
        self._stop_collectors()
        self.pool.shutdown(wait=True, cancel_futures=True)


class Served:
    """A predictor behind the service; subclasses expose the protocol's method."""

    def __init__(self, service: PredictorService, name: str, models: Sequence[str]) -> None:
        self.service, self.name, self.models = service, name, frozenset(models)

    async def _call(self, reqs: Sequence[RoutingRequest]) -> list[Any]:
        return await self.service.submit(self.name, [from_request(r) for r in reqs])


class ServedSemanticRouter(Served):
    async def confidence(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return await self._call(reqs)


class ServedLength(Served):
    async def remaining_tokens(self, reqs: Sequence[RoutingRequest]
                               ) -> list[Mapping[str, float]]:
        return await self._call(reqs)


class ServedKnn(Served):
    async def estimate(self, reqs: Sequence[RoutingRequest]
                       ) -> list[Mapping[str, QualityLength]]:
        return await self._call(reqs)


class ServedCapability(Served):
    async def capability(self, reqs: Sequence[RoutingRequest]) -> list[Mapping[str, float]]:
        return await self._call(reqs)


SERVED: dict[str, type[Served]] = {"semantic_router": ServedSemanticRouter,
                                   "length": ServedLength, "knn": ServedKnn,
                                   "capability": ServedCapability}
"""The predictors the service runs (``tpot`` is synchronous and stays in-process)."""
