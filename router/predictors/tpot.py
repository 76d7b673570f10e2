"""Latency heads (RouteBalance section 4.2): per engine, an XGBoost model of the time per
output token (ms) from the engine state.

Training data is a telemetry log: the engines' ``SchedulerSnapshot`` frames as JSON lines
(``msgspec.json``; ``python -m router.predictors.telemetry_log`` records one). Two
consecutive step frames a, b of an engine (heartbeats between them skipped, no frame
lost, both with running requests) give one sample:

  TPOT = 1000 x (ts_b - ts_a) / (step_b - step_a)   ms, every step decodes one token per
                                                    running request,

with features taken at a: batch size, pending decode tokens, prefill tokens mixed into
the steps (``queued_prefill_tokens``; at routing time the placed request's prompt
tokens) and KV usage. The policy combines the head with live state (routebalance's
latency formula).
"""

from __future__ import annotations

import dataclasses
import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import msgspec
import numpy as np
from tqdm import tqdm
from xgboost import XGBRegressor

from engine_ext.telemetry import SchedulerSnapshot
from router.predictors.artifact import Metadata, library_versions, read_metadata, write_metadata
from router.predictors.base import TpotQuery


@dataclass(frozen=True)
class TpotSettings:
    """XGBoost settings of every engine's head (RouteBalance section 4.2 names the model,
    not its hyper-parameters)."""

    n_estimators: int = 200
    """Boosting rounds."""
    max_depth: int = 4
    """Depth of each tree."""
    learning_rate: float = 0.1
    """Shrinkage per round."""
    seed: int = 0


FEATURES = ("batch_size", "pending_decode_tokens", "context_tokens", "kv_usage")


@dataclass(frozen=True)
class TpotSample:
    engine: str
    batch_size: int
    pending_decode_tokens: int
    context_tokens: int
    kv_usage: float
    tpot_ms: float
    block: int = 0
    """Index of the sample's run of ``BLOCK`` consecutive samples of its engine."""


BLOCK = 50


def read_telemetry_log(path: str | Path) -> list[SchedulerSnapshot]:
    """Snapshots of a JSON-lines log (``.gz`` allowed); ValueError naming a bad line."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    out = []
    with opener(p, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(msgspec.json.decode(line, type=SchedulerSnapshot))
                except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as e:
                    raise ValueError(f"{p.name}:{n}: not a scheduler snapshot ({e})") from None
    return out


def tpot_ms(a: SchedulerSnapshot, b: SchedulerSnapshot) -> float:
    """1000 x (ts_b - ts_a) / (step_b - step_a)."""
    return 1000.0 * (b.ts - a.ts) / (b.step - a.step)


def samples(snapshots: Iterable[SchedulerSnapshot]) -> list[TpotSample]:
    """One sample per pair of consecutive step frames of an engine (heartbeats skipped,
    no frame lost between them), both with running requests."""
    by_engine: dict[str, list[SchedulerSnapshot]] = {}
    for s in snapshots:
        by_engine.setdefault(s.engine_id, []).append(s)
    out = []
    for engine, frames in by_engine.items():
        seen = {s.seq for s in frames}
        steps = sorted((s for s in frames if not s.heartbeat), key=lambda s: s.seq)
        mine = -1
        for a, b in zip(steps, steps[1:]):
            whole = all(q in seen for q in range(a.seq + 1, b.seq))
            if whole and b.step > a.step and a.batch_size > 0 and b.batch_size > 0 \
                    and b.ts > a.ts:
                mine += 1
                out.append(TpotSample(engine, a.batch_size, a.pending_decode_tokens,
                                      a.queued_prefill_tokens, a.kv_usage, tpot_ms(a, b),
                                      mine // BLOCK))
    return out


def matrix(rows: Sequence[TpotSample | TpotQuery]) -> np.ndarray:
    return np.array([[getattr(r, k) for k in FEATURES] for r in rows], dtype=np.float32)


class TpotHeads:
    """``tpot_ms`` satisfies ``base.TpotPredictor`` (synchronous, in-process)."""

    KIND: ClassVar[str] = "tpot"

    def __init__(self, heads: Mapping[str, XGBRegressor], settings: TpotSettings,
                 meta: Metadata | None = None) -> None:
        self.heads = dict(heads)
        self.engines = frozenset(self.heads)
        self.models: frozenset[str] = frozenset()
        self.settings, self.meta = settings, meta

    def tpot_ms(self, queries: Sequence[TpotQuery]) -> list[float]:
        out = np.empty(len(queries))
        by_engine: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_engine.setdefault(q.engine, []).append(i)
        for engine, idx in by_engine.items():
            out[idx] = self.heads[engine].predict(matrix([queries[i] for i in idx]))
        return [max(0.0, float(v)) for v in out]

    @classmethod
    def train(cls, rows: Sequence[TpotSample], settings: TpotSettings,
              progress: bool = True) -> TpotHeads:
        engines = sorted({r.engine for r in rows})
        heads = {}
        for engine in tqdm(engines, desc="tpot heads", disable=not progress):
            mine = [r for r in rows if r.engine == engine]
            heads[engine] = XGBRegressor(
                n_estimators=settings.n_estimators, max_depth=settings.max_depth,
                learning_rate=settings.learning_rate, random_state=settings.seed,
                n_jobs=1).fit(matrix(mine), np.array([r.tpot_ms for r in mine]))
        return cls(heads, settings)

    def save(self, folder: str | Path, data: dict[str, Any]) -> None:
        path = Path(folder)
        (path / "heads").mkdir(parents=True, exist_ok=True)
        for i, engine in enumerate(sorted(self.heads)):  # file i: metadata engines[i]
            self.heads[engine].save_model(str(path / "heads" / f"{i}.json"))
        write_metadata(path, Metadata(
            kind=self.KIND, models=[], engines=sorted(self.heads),
            feature_settings={"features": list(FEATURES)},
            train_settings=dataclasses.asdict(self.settings), data=data,
            libraries=library_versions(["xgboost", "numpy"])))

    @classmethod
    def load(cls, folder: str | Path, expected: Mapping[str, Any] | None = None
             ) -> TpotHeads:
        path = Path(folder)
        meta = read_metadata(path, cls.KIND, {"features": list(FEATURES), **(expected or {})})
        heads = {}
        for i, engine in enumerate(meta.engines):
            heads[engine] = XGBRegressor()
            heads[engine].load_model(str(path / "heads" / f"{i}.json"))
        return cls(heads, TpotSettings(**meta.train_settings), meta)
