"""``RouterCore``: the router's shared state with its two halves over it.

``routing`` (``router.dispatch.routing``) decides and records requests; ``membership``
(``router.dispatch.membership``) keeps the engines routed to, from telemetry, health
probes, admin verdicts and the other router workers. Both read the typed ``[router]``
settings of the cluster file; ``state`` is what they share.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from router.config.cluster import ClusterConfig
from router.dispatch.membership import Membership
from router.dispatch.routing import Routing
from router.policies.base import Policy
from router.predictors.base import PredictorSet
from router.state.cluster import ClusterState
from router.telemetry_source import TelemetrySource


class RouterCore:
    """State, routing and membership of one router process (the front's handle)."""

    def __init__(self, config: ClusterConfig, predictors: PredictorSet | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, worker: int | None = None,
                 telemetry: TelemetrySource | None = None) -> None:
        """``worker``: this process's index among ``config.router.workers`` router
        processes serving one port (``router.dispatch.peers``); None for a lone router.
        ``telemetry``: where the engines' telemetry comes from (``Membership``)."""
        r = config.router
        self.state = ClusterState(config.instances(), r.heartbeat_timeout_s,
                                  r.scheduler_stall_timeout_s, r.program_ttl_s,
                                  r.scrape_timeout_s, r.sole_engine_timeout_s, wall_clock,
                                  r.max_programs)
        self.membership = Membership(config, self.state, clock, worker, telemetry)
        self.routing = Routing(r, self.state, predictors or PredictorSet(),
                               self.membership.peers, self.membership.prober, clock, wall_clock)

    def build_policy(self) -> Policy[Any]:
        """Build the configured policy (ValueError: bad settings, missing predictor); it
        hears of engines added and removed."""
        self.membership.changes.policy = policy = self.routing.build_policy()
        return policy

    async def start(self) -> None:
        """Build the policy (unless built), then subscribe to every engine's streams."""
        if self.routing.policy is None:
            self.build_policy()
        await self.membership.start()

    async def stop(self) -> None:
        await self.membership.stop()
        await self.routing.stop()
