"""An asyncio event loop on the twin's virtual clock.

The router's and the client's coroutines (``router.app.Front``, the replay's
``AgenticClient``) run on it unchanged: ``loop.time()`` is the simulator's clock, so
``asyncio.sleep``, the batch collector's window and every timer are virtual. Where a real
loop would wait for I/O, this one runs the simulator's next engine event due before its
next timer (or moves the clock to that timer). Work handed to a thread
(``asyncio.to_thread``: tokenizing a large prompt) runs inline, so no work happens outside
the clock's view and a run stays a function of its inputs.
"""

from __future__ import annotations

import asyncio
import math
import selectors
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from kernels_bench.lab.twin.sim import Simulator

T = TypeVar("T")


class Stuck(RuntimeError):
    """Every coroutine waits and neither an engine event nor a timer is left."""


class _VirtualSelector(selectors.DefaultSelector):
    """The loop's selector: real registrations (the loop's wake-up pipe), virtual waits."""

    def __init__(self, sim: Simulator) -> None:
        super().__init__()
        self._sim = sim
        self.engine_wall_s = 0.0
        """Wall time spent running engine events (not the router's or the client's)."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready:
            return ready
        until = math.inf if timeout is None else self._sim.now() + timeout
        t0 = time.perf_counter()
        ran = self._sim.run_next(until)
        self.engine_wall_s += time.perf_counter() - t0
        if not ran and until == math.inf:
            raise Stuck("the twin is stuck: every coroutine waits, and no engine event or "
                        "timer is left to run")
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose time is ``sim``'s clock and whose waits run ``sim``."""

    def __init__(self, sim: Simulator) -> None:
        self._virtual = _VirtualSelector(sim)
        super().__init__(self._virtual)
        self.sim = sim

    @property
    def engine_wall_s(self) -> float:
        """Wall time this loop spent running engine events so far."""
        return self._virtual.engine_wall_s

    def time(self) -> float:
        return self.sim.now()

    def run_in_executor(self, executor: Executor | None, func: Callable[..., T],
                        *args: Any) -> asyncio.Future[T]:
        """``func(*args)`` now, in this thread (no wall time passes unseen)."""
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future
