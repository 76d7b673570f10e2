"""The discrete-event core: a virtual clock and a queue of (time, seq, action) driving
engine twins. No threads, no wall time; ties run in the order they were queued, so a run
is a function of its inputs (and the step-time models' seeds).

Per engine, one pending ``step`` event at most: an arrival at an idle engine queues one
at the arrival time (after any other arrival queued for that same instant), a step's end
is the next step's start. Completion callbacks run at the end of the finishing step; a
request they submit at that instant joins the engine's next step, not the one starting.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from engine_ext.telemetry import DEFAULT_INTERVAL_S
from kernels_bench.lab.twin.engine import EngineTwin
from kernels_bench.lab.twin.engine_spec import EngineSpec
from kernels_bench.lab.twin.request import RequestRecord, TwinRequest
from kernels_bench.lab.twin.step_time import StepTimeModel
from kernels_bench.lab.twin.telemetry import Frame

FinishCallback = Callable[[RequestRecord], None]
TelemetryCallback = Callable[[EngineTwin, list[Frame], list[Frame]], None]
"""``(engine, snapshot frames, KV event frames)`` produced by one of its steps."""


class Simulator:
    """Engine twins on one virtual clock (seconds, starting at 0)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._seq = 0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self.engines: dict[str, EngineTwin] = {}
        self._on_finish: list[FinishCallback] = []
        self._on_telemetry: list[TelemetryCallback] = []

    def now(self) -> float:
        return self._now

    def add_engine(self, spec: EngineSpec, step_time: StepTimeModel,
                   telemetry: bool = False,
                   telemetry_interval_s: float = DEFAULT_INTERVAL_S) -> EngineTwin:
        """An engine twin on this clock; ``telemetry``: it publishes snapshots (at the
        engine's rate; none from a stock engine) and KV events, handed to
        ``on_telemetry`` callbacks."""
        if spec.name in self.engines:
            raise ValueError(f"engine {spec.name!r} added twice")
        twin = EngineTwin(spec, step_time, self.now,
                          telemetry_interval_s if telemetry else None)
        self.engines[spec.name] = twin
        return twin

    def on_finish(self, callback: FinishCallback) -> None:
        self._on_finish.append(callback)

    def on_telemetry(self, callback: TelemetryCallback) -> None:
        self._on_telemetry.append(callback)

    def call_at(self, at: float, action: Callable[[], None]) -> None:
        """Run ``action`` at virtual time ``at`` (not in the past)."""
        if at < self._now:
            raise ValueError(f"time {at} is in the past (now {self._now})")
        heapq.heappush(self._queue, (at, self._seq, action))
        self._seq += 1

    def submit(self, engine: str, request: TwinRequest, at: float) -> None:
        """``request`` arrives at ``engine`` at virtual time ``at``."""
        twin = self.engines[engine]
        self.call_at(at, lambda: self._arrive(twin, request))

    def receive(self, engine: str, request: TwinRequest) -> None:
        """``request`` arrives at ``engine`` now (ValueError, raised here: a request the
        engine refuses)."""
        self._arrive(self.engines[engine], request)

    def run(self, until: float | None = None) -> None:
        """Process events in time order until none is left (or the next is after
        ``until``; the clock then stops at ``until``). Telemetry made before (an added
        engine's announcement of its idle state) is handed on first."""
        for twin in self.engines.values():
            if twin.kv_events is not None:
                self.hand_on(twin)
        while self._queue:
            if until is not None and self._queue[0][0] > until:
                self._now = until
                return
            self._now, _, action = heapq.heappop(self._queue)
            action()

    def next_time(self) -> float | None:
        """When the next event runs (None: no event is queued)."""
        return self._queue[0][0] if self._queue else None

    def run_next(self, until: float) -> bool:
        """Run the next event if it is due by ``until`` (True); else move the clock to
        ``until`` (False). The twin's event loop (``loop.VirtualLoop``) steps with this."""
        if self._queue and self._queue[0][0] <= until:
            self._now, _, action = heapq.heappop(self._queue)
            action()
            return True
        self._now = max(self._now, until)
        return False

    def _arrive(self, twin: EngineTwin, request: TwinRequest) -> None:
        twin.receive(request)
        if not twin.busy:
            twin.busy = True
            self.call_at(self._now, lambda: self._step(twin))

    def _step(self, twin: EngineTwin) -> None:
        finished, duration = twin.step()
        if duration is None:
            twin.busy = False
        else:
            self.call_at(self._now + duration, lambda: self._step(twin))
        if twin.kv_events is not None:
            self.hand_on(twin)
        for record in finished:
            for callback in self._on_finish:
                callback(record)

    def hand_on(self, twin: EngineTwin) -> None:
        """Give ``on_telemetry`` the frames ``twin`` made since the last call."""
        assert twin.kv_events is not None
        snaps = twin.snapshots.frames if twin.snapshots is not None else []
        kv = twin.kv_events.frames
        if not snaps and not kv:
            return
        if twin.snapshots is not None:
            twin.snapshots.frames = []
        twin.kv_events.frames = []
        for callback in self._on_telemetry:
            callback(twin, snaps, kv)
