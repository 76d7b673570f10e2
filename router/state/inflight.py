"""The router's own in-flight accounting (part of Chimera's activity monitor, section 3.5).

Every request the router sends is recorded until its completion, error, abort or client
disconnect (``release``), until its engine reports it finished in a snapshot
(``finished``), or until its engine goes down (``release_engine``). Per engine the ledger
keeps the sums policies read: in-flight requests and predicted tokens, and the requests
(with their prefill and decode tokens) the engine has not reported yet, which the
router adds to the last snapshot's counters between snapshots.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_API_PREFIXES = ("chatcmpl-", "cmpl-")


@dataclass(slots=True)
class InflightRecord:
    request_id: str
    engine: str
    model: str
    predicted_tokens: float
    """Predicted remaining tokens the policy attached (0 without a prediction)."""
    prefill_tokens: int
    """Prompt tokens the engine must compute (prompt minus predicted cached prefix)."""
    decode_tokens: int
    """``max_tokens`` as the engine counts it in ``pending_decode_tokens``."""
    sent_wall: float
    """``time.time()`` when routed; snapshots taken later include the request."""
    reported: bool = False


@dataclass(slots=True)
class EngineLoad:
    """Sums over one engine's in-flight records."""

    requests: int = 0
    predicted_tokens: float = 0.0
    unreported_requests: int = 0
    unreported_prefill_tokens: int = 0
    unreported_decode_tokens: int = 0
    records: dict[str, InflightRecord] = field(default_factory=dict)


def _client_id(engine_request_id: str) -> str:
    """``chatcmpl-<id>-<8 hex>`` (vLLM's engine-side id) -> ``<id>``."""
    rid = _ENGINE_SUFFIX.sub("", engine_request_id)
    for prefix in _API_PREFIXES:
        if rid.startswith(prefix):
            return rid[len(prefix):]
    return rid


class InflightLedger:
    def __init__(self) -> None:
        self._records: dict[str, InflightRecord] = {}
        self._engines: dict[str, EngineLoad] = {}
        self._model_tokens: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._records)

    def load(self, engine: str) -> EngineLoad:
        load = self._engines.get(engine)
        if load is None:
            load = self._engines[engine] = EngineLoad()
        return load

    def model_predicted_tokens(self, model: str) -> float:
        """P_m: in-flight predicted tokens over every engine of ``model``."""
        return self._model_tokens.get(model, 0.0)

    def add(self, rec: InflightRecord) -> None:
        self.release(rec.request_id)
        self._records[rec.request_id] = rec
        load = self.load(rec.engine)
        load.records[rec.request_id] = rec
        load.requests += 1
        load.predicted_tokens += rec.predicted_tokens
        load.unreported_requests += 1
        load.unreported_prefill_tokens += rec.prefill_tokens
        load.unreported_decode_tokens += rec.decode_tokens
        self._model_tokens[rec.model] = self._model_tokens.get(rec.model, 0.0) \
            + rec.predicted_tokens

    def release(self, request_id: str) -> InflightRecord | None:
        """Forget a request (idempotent); returns its record if it was still in flight."""
        rec = self._records.pop(request_id, None)
        if rec is None:
            return None
        load = self._engines[rec.engine]
        del load.records[request_id]
        load.requests -= 1
        load.predicted_tokens -= rec.predicted_tokens
        self._model_tokens[rec.model] -= rec.predicted_tokens
        if not load.records:  # no float drift on an idle engine
            load.predicted_tokens = 0.0
        if not rec.reported:
            self._unreport(load, rec)
        return rec

    def release_engine(self, engine: str) -> list[InflightRecord]:
        """Forget every request of an engine that went down."""
        return [r for r in (self.release(rid) for rid in list(self.load(engine).records)) if r]

    def mark_reported(self, engine: str, snapshot_wall: float) -> None:
        """Requests sent before a snapshot was taken are in that snapshot's counters."""
        load = self.load(engine)
        if not load.unreported_requests:
            return
        for rec in load.records.values():
            if not rec.reported and rec.sent_wall <= snapshot_wall:
                rec.reported = True
                self._unreport(load, rec)

    def finished(self, engine: str, engine_request_ids: list[str]) -> None:
        """Release requests an engine reported finished (ids as the engine knows them)."""
        records = self.load(engine).records
        for erid in engine_request_ids:
            rid = erid if erid in records else _client_id(erid)
            if rid in records:
                self.release(rid)

    @staticmethod
    def _unreport(load: EngineLoad, rec: InflightRecord) -> None:
        load.unreported_requests -= 1
        load.unreported_prefill_tokens -= rec.prefill_tokens
        load.unreported_decode_tokens -= rec.decode_tokens
