"""``least_kv``: the engine with the least KV cache in use.

Lowest ``kv_usage`` (the fraction of the engine's KV cache blocks in use, from its last
snapshot or scrape) wins; ties go to fewer requests in flight from the router, then the
name.
"""

from __future__ import annotations

from typing import Sequence

from router.policies.pickers.base import Pick, Picker
from router.state.view import EngineView, StateView
from router.types import RoutingRequest


class LeastKv(Picker):
    name = "least_kv"
    inputs = frozenset({"kv_usage", "inflight_requests"})

    def pick(self, req: RoutingRequest, cands: Sequence[EngineView],
             view: StateView) -> Pick:
        return Pick(min(cands, key=lambda e: (e.kv_usage, e.inflight_requests, e.name)), {})
