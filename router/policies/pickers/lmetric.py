"""``lmetric``: LMETRIC (section 5), KV-aware engine choice by one multiplication.

score_i = prefill_i x b_i, lowest wins, with
  prefill_i = P - C_i + Q_i  (new prefill tokens if routed to i: prompt tokens minus the
                              prefix i has cached, plus i's queued prefill tokens),
  b_i       = i's batch size (its running plus waiting requests), plus 1 with
              ``count_arriving`` (the batch the request would join; hetserve's, off by
              default).
Ties (e.g. several idle engines, b = 0) go to fewer new prefill tokens, then the name.

Two-phase hotspot detector for the request's prefix class (the hash of its first
block; M = candidates caching it, M-bar = the others):
  phase 1: the class is among the ``hot_top_k`` most frequent of the last ``hot_window``
           classes and x / x-bar > |M| / |M-bar|, with x and x-bar the summed batch
           sizes of M and M-bar (the cache holders carry more than their share);
  phase 2: while phase 1 holds, M wins more than ``win_factor`` x |M| decisions in a
           row. Then the class is a hotspot: its requests skip M and go to the least
           loaded engine of M-bar (load balance only) until phase 1 stops holding.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Mapping, Sequence

from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.pickers.base import Pick, Picker
from router.settings import STRICT, PositiveInt, decode
from router.state.view import EngineView, StateView
from router.types import RoutingRequest


@pydantic_dataclass(frozen=True, config=STRICT)
class LMetricSettings:
    hotspot_detection: bool = True
    hot_window: PositiveInt = 512
    """Recent requests over which prefix-class frequencies are counted (chosen here)."""
    hot_top_k: PositiveInt = 4
    """How many of the hottest prefix classes phase 1 examines (chosen here)."""
    win_factor: PositiveInt = 2
    """Phase 2 threshold: more than win_factor x |M| consecutive wins (LMETRIC: 2)."""
    count_arriving: bool = False
    """b_i + 1 in ``lmetric_score`` instead of LMETRIC's b_i. With b_i an idle engine
    scores 0 whatever it must prefill, so a program's next call leaves the engine that
    caches its prefix for any idle one (docs/research/retention.md, "Engine-sticky")."""


def new_prefill_tokens(prompt: int, cached: int, queued_prefill: int) -> int:
    """prefill_i = P - C_i + Q_i."""
    return prompt - cached + queued_prefill


def lmetric_score(prefill: int, batch_size: int, count_arriving: bool = False) -> int:
    """score_i = prefill_i x b_i (``count_arriving``: x (b_i + 1))."""
    return prefill * (batch_size + count_arriving)


def hotspot_phase1(x: float, x_bar: float, m: int, m_bar: int) -> bool:
    """x / x-bar > |M| / |M-bar|, cross-multiplied (x-bar may be 0)."""
    return x * m_bar > m * x_bar


class HotspotDetector:
    """LMETRIC's two-phase detector; its counters are this picker's decision history."""

    def __init__(self, window: int, top_k: int, win_factor: int) -> None:
        self.top_k, self.win_factor = top_k, win_factor
        self._recent: deque[int] = deque(maxlen=window)
        self._counts: Counter[int] = Counter()
        self.streak: dict[int, int] = {}
        self.hot: set[int] = set()

    def _observe(self, cls: int) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._recent.append(cls)
        self._counts[cls] += 1

    def _among_hottest(self, cls: int) -> bool:
        mine = self._counts[cls]
        return sum(1 for c in self._counts.values() if c > mine) < self.top_k

    def hotspot(self, cls: int, holders: Sequence[EngineView], others: Sequence[EngineView],
                winner: EngineView) -> bool:
        """Record one decision of class ``cls``; True if its holders are a hotspot."""
        self._observe(cls)
        phase1 = bool(holders) and bool(others) and self._among_hottest(cls) and \
            hotspot_phase1(sum(e.requests for e in holders), sum(e.requests for e in others),
                           len(holders), len(others))
        if not phase1:
            self.streak.pop(cls, None)
            self.hot.discard(cls)
            return False
        if cls in self.hot:
            return True
        won = any(e.name == winner.name for e in holders)
        self.streak[cls] = self.streak.get(cls, 0) + 1 if won else 0
        if self.streak[cls] > self.win_factor * len(holders):
            self.hot.add(cls)
            return True
        return False


class LMetricPicker(Picker):
    """Settings: the ``[router.policies.lmetric]`` table (``LMetricSettings``), which the
    ``lmetric`` policy, this picker over every candidate, reads too."""

    name = "lmetric"
    inputs = frozenset({"requests", "prefill_tokens", "prefix_hits", "prefix_class"})
    uses_prompt = True

    @classmethod
    def built(cls, tables: Mapping[str, Mapping[str, Any]]) -> LMetricPicker:
        return cls(decode(LMetricSettings, tables.get("lmetric", {}), "router.policies.lmetric"))

    def __init__(self, settings: LMetricSettings) -> None:
        self.settings = settings
        self.detector = HotspotDetector(settings.hot_window, settings.hot_top_k,
                                        settings.win_factor)

    def pick(self, req: RoutingRequest, cands: Sequence[EngineView],
             view: StateView) -> Pick:
        """The engine for ``req``; ``info["hotspot"]``: whether the hotspot filter applied."""
        cands = list(cands)
        names = [e.name for e in cands]
        hits = view.prefix_hits(req, names)
        prompt = req.num_prompt_tokens
        prefill = [new_prefill_tokens(prompt, cached, e.prefill_tokens)
                   for e, (_, cached) in zip(cands, hits)]
        requests = [e.requests for e in cands]
        arriving = self.settings.count_arriving
        best = min(range(len(cands)), key=lambda i: (
            lmetric_score(prefill[i], requests[i], arriving), prefill[i]))
        winner = cands[best]
        if not self.settings.hotspot_detection or len(cands) < 2:
            return Pick(winner, {"hotspot": False})
        cls = view.prefix_class(req, names)
        if cls is None:
            return Pick(winner, {"hotspot": False})
        holders = [i for i, (matched, _) in enumerate(hits) if matched]
        others = [i for i, (matched, _) in enumerate(hits) if not matched]
        if not self.detector.hotspot(cls, [cands[i] for i in holders],
                                     [cands[i] for i in others], winner):
            return Pick(winner, {"hotspot": False})
        return Pick(cands[min(others, key=lambda i: (requests[i], prefill[i]))],
                    {"hotspot": True})
