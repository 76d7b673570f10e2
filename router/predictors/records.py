"""The flat training table every predictor learns from: one row per (workflow run, stage).

A *run* is one problem solved by one workflow with one model serving every stage
(the trace builder runs each model on each problem, so labels exist for every model).
Sources (the project's traces, CHAMP, fixtures) are converted into ``StageRecord`` rows;
``held_out`` holds problems out by a seeded hash of their id, so train and evaluate agree
on the split without sharing state.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping, Sequence


HASHED_WHEN_SET = "hashed_when_set"
"""Field metadata: ``fingerprint`` skips the field while it is None."""


@dataclass(frozen=True)
class StageRecord:
    problem_id: str
    run_id: str
    """One workflow run: problem x workflow x model."""
    workflow: str
    stage: str
    stage_index: int
    num_stages: int
    model: str
    system_text: str
    user_text: str
    prompt_text: str
    """The full input the model saw (messages rendered as text, history included)."""
    prompt_tokens: int
    output_tokens: int
    remaining_tokens: int
    """Output tokens of this stage and every later stage of the run."""
    correct: bool
    """The run's final answer was right."""
    task: str = ""
    """Task family (``math``, ``code``, ...), where the source knows it."""
    p_correct: float | None = dataclasses.field(default=None, metadata={HASHED_WHEN_SET: True})
    """P(correct) of this (problem, workflow, model): the share of its sampled runs that
    were right (``WorkflowRun.p_correct``); None where the source has no samples."""

    @property
    def label(self) -> float:
        """The quality label: ``p_correct`` where known, else ``correct`` as 1.0 / 0.0."""
        return float(self.correct) if self.p_correct is None else self.p_correct


FIELDS = tuple(f.name for f in dataclasses.fields(StageRecord))


def fingerprint(rows: Sequence[Any]) -> str:
    """sha256 over the rows' (dataclasses') canonical JSON, in order. A field marked
    ``HASHED_WHEN_SET`` counts only when not None, so rows that leave it unset hash as
    before it existed (artifacts trained on them stay current)."""
    h = hashlib.sha256()
    for r in rows:
        values = [getattr(r, f.name) for f in dataclasses.fields(r)
                  if not (f.metadata.get(HASHED_WHEN_SET) and getattr(r, f.name) is None)]
        h.update(json.dumps(values, ensure_ascii=False).encode())
        h.update(b"\n")
    return "sha256:" + h.hexdigest()


def seeded_uniform(key: str, seed: int | str) -> float:
    """``sha256("seed:key")[:8] / 2**64``: uniform on [0, 1), the same for the same key
    and seed in every process (splits, ``random_mix``, subsets)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out(problem_id: str, seed: int, fraction: float, start: float = 0.0) -> bool:
    """A problem is held out when its seeded hash (``seeded_uniform``) falls in
    ``[start, start + fraction)``."""
    return start <= seeded_uniform(problem_id, seed) < start + fraction


@dataclass(frozen=True, order=True)
class Split:
    """The problems a predictor's training left out (``held_out``). Fold ``k`` of ``K``
    (cross-fitting: every problem held out by exactly one fold) is
    ``Split(seed, 1 / K, k / K)``."""

    seed: int
    fraction: float
    start: float = 0.0

    def holds_out(self, key: str) -> bool:
        return held_out(key, self.seed, self.fraction, self.start)

    @classmethod
    def fold(cls, seed: int, k: int, folds: int) -> Split:
        return cls(seed, 1 / folds, k / folds)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Split:
        """From an artifact's ``data`` metadata (``holdout_start`` absent: 0)."""
        return cls(int(data["seed"]), float(data["holdout"]),
                   float(data.get("holdout_start", 0.0)))

    def info(self) -> dict[str, Any]:
        """The metadata fields ``of`` reads."""
        return {"seed": self.seed, "holdout": self.fraction, "holdout_start": self.start}


def group(records: Iterable[StageRecord], *keys: str) -> dict[tuple[str, ...], list[StageRecord]]:
    out: dict[tuple[str, ...], list[StageRecord]] = defaultdict(list)
    for r in records:
        out[tuple(str(getattr(r, k)) for k in keys)].append(r)
    return dict(out)


def models_of(records: Iterable[StageRecord]) -> list[str]:
    return sorted({r.model for r in records})


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def write_jsonl(records: Iterable[StageRecord], path: str | Path) -> None:
    with _open(Path(path), "w") as f:
        for r in records:
            f.write(json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> Iterator[StageRecord]:
    """Rows of a records file; ValueError naming the line of a bad row."""
    with _open(Path(path), "r") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                yield StageRecord(**{k: row[k] for k in FIELDS if k in row})
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{Path(path).name}:{n}: not a stage record ({e})") from None
