"""What the agents said of the router's choices: per (context, model) success posteriors
learned online from outcomes (issue 59), and the ledger that ties an outcome to the
decision it judges.

An outcome arrives two ways. A retry names the models its stage already tried
(``workflow.tried_models``): each of them failed that stage's check (``retry``). And the
agent reports a program, or one stage of it, passed, failed or scored s in [0, 1]
(``report``: ``POST /v1/hetserve/outcomes``, ``router.routes.outcomes``). Either credits
the (context, model) arm of the call it judges with s successes and 1 - s failures, once:
a credit is keyed by (program, stage, model), and a second one for the same key is a
duplicate. An outcome for a program the book never saw is ``unknown``; for one it saw but
has forgotten (its bounded ledger dropped it, oldest first) ``late``. Nothing is credited
for either, and every verdict is counted (``counts``, exported as
``hetserve_outcomes_total``).

Each arm is a Beta posterior (``alpha``, ``beta`` pseudo counts). A context's arm borrows
its prior from its workflow's arm of the same model (``prior_weight`` pseudo counts at the
parent's mean), so a new length bucket starts from what its workflow taught. Memory is
bounded: past ``memory`` pseudo counts an arm's counts are scaled down (exponential
forgetting), so the posterior never becomes certain and a workload that changes is
relearned (the drift run, docs/research/online.md).

The book is written atomically (a temporary file, fsync, ``os.replace``) every
``save_every`` credits and read back when the policy starts, so a router restart loses at
most the credits since the last write (none at ``save_every = 1``); the ledger is written
with them, so a program first routed after the last write is ``unknown`` after a restart
(its outcome is lost, nothing learned is). One router worker's
book is its own: with ``router.workers`` > 1 each worker learns from the outcomes it
receives for programs it routed (an outcome for another worker's program is ``unknown``
there); the workers do not share posteriors (docs/policies.md, "online").
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VERDICTS = ("accepted", "duplicate", "unknown", "late", "retry_failure")
"""What became of an outcome (``OutcomeBook.counts``' keys)."""
FORMAT = 1
"""The state file's format version."""
MAX_KEY_CHARS = 256
"""Longest workflow or stage name kept in a context key (longer are cut)."""
PROGRAM_STAGE = ""
"""The stage key of a program-level outcome: it judges the call that chose the model."""


@dataclass
class Arm:
    alpha: float
    beta: float

    @property
    def mean(self) -> float:
        return self.alpha / (self.alpha + self.beta)


@dataclass
class Pending:
    """One program's routed calls the book may still credit."""

    first: str
    """The stage key of the call that chose the program's model."""
    calls: dict[str, tuple[str, str]]
    """Stage key -> (context, model) of its latest call."""
    credited: set[tuple[str, str]]
    """(stage key, model) credits given."""
    features: dict[str, Features] = field(default_factory=dict)
    """Stage key -> the call's prompt features, where the policy keeps examples."""


Features = tuple[tuple[int, ...], tuple[float, ...]]
"""A prompt's sparse feature vector: indices and values (the policy's encoding)."""


@dataclass(frozen=True)
class Example:
    """A credited call whose prompt features the policy gave: what its neighbours learn."""

    indices: np.ndarray
    values: np.ndarray
    model: str
    score: float

    @classmethod
    def of(cls, features: Features, model: str, score: float) -> Example:
        return cls(np.asarray(features[0], np.int32), np.asarray(features[1], np.float32),
                   model, score)


def context_key(workflow: str | None, stage: str | None, bucket: int | None) -> str:
    """A context's key: workflow, stage and prompt length bucket (None: the workflow's
    own arm, every context's parent)."""
    w, s = (workflow or "")[:MAX_KEY_CHARS], (stage or "")[:MAX_KEY_CHARS]
    return f"{w}\x1f" if bucket is None else f"{w}\x1f{s}\x1f{bucket}"


def parent_key(key: str) -> str:
    return key.split("\x1f", 1)[0] + "\x1f"


class OutcomeBook:
    """Per (context, model) Beta posteriors and the ledger of routed programs."""

    def __init__(self, path: str | None = None, *, max_programs: int = 100_000,
                 max_arms: int = 100_000, prior_weight: float = 2.0, memory: float = 1000.0,
                 priors: Mapping[str, float] | None = None, save_every: int = 1,
                 max_examples: int = 0) -> None:
        self.path = None if path is None else Path(path)
        self.max_programs, self.max_arms = max_programs, max_arms
        self.prior_weight, self.memory, self.save_every = prior_weight, memory, save_every
        self.priors = dict(priors or {})
        self.arms: OrderedDict[tuple[str, str], Arm] = OrderedDict()
        self.programs: OrderedDict[str, Pending] = OrderedDict()
        self.forgotten: OrderedDict[str, None] = OrderedDict()
        """Programs dropped from the ledger (bounded as it is): their outcomes are late."""
        self.counts = dict.fromkeys(VERDICTS, 0)
        self.examples: deque[Example] = deque(maxlen=max_examples)
        """The last ``max_examples`` credited calls with features (oldest leave first)."""
        self.added = 0
        """Examples ever added (a policy's index of them is stale while it differs)."""
        self.on_example: Callable[[], None] | None = None
        """Called after an example is added (the policy's index may rebuild)."""
        self.unsaved = 0
        if self.path is not None and self.path.exists():
            self.load()

    # -- decisions ---------------------------------------------------------------------

    def note(self, program: str | None, stage: str, context: str, model: str,
             features: Features | None = None) -> None:
        """The call of ``program``'s stage ``stage`` in ``context`` (prompt ``features``,
        kept as an example when credited) went to ``model``."""
        if program is None:
            return
        p = self.programs.get(program)
        if p is None:
            self.forgotten.pop(program, None)
            p = self.programs[program] = Pending(stage, {}, set())
            while len(self.programs) > self.max_programs:
                old, _ = self.programs.popitem(last=False)
                self.forgotten[old] = None
                while len(self.forgotten) > self.max_programs:
                    self.forgotten.popitem(last=False)
        else:
            self.programs.move_to_end(program)
        p.calls[stage] = (context, model)
        if features is not None:
            p.features[stage] = features

    def retry(self, program: str | None, stage: str, context: str,
              tried: Iterable[str]) -> int:
        """A retry of ``program``'s stage says each model of ``tried`` failed it: a failure
        for each, once; how many were credited."""
        if program is None:
            return 0
        p = self.programs.get(program)
        n = 0
        for model in tried:
            key = (stage, model)
            if p is not None and key in p.credited:
                continue
            ctx = p.calls[stage][0] if p is not None and stage in p.calls else context
            if p is not None:
                p.credited.add(key)
                self._example(p, stage, model, 0.0)
            n += 1
            self.counts["retry_failure"] += 1
            self._credit(ctx, model, 0.0)
        return n

    # -- reports -----------------------------------------------------------------------

    def report(self, program: str, stage: str | None, score: float) -> str:
        """The agent's outcome for ``program`` (or its stage ``stage``): a verdict of
        ``VERDICTS``; only ``accepted`` credits an arm."""
        p = self.programs.get(program)
        if p is None:
            verdict = "late" if program in self.forgotten else "unknown"
        else:
            key = p.first if stage is None else stage
            if key not in p.calls:
                verdict = "unknown"
            else:
                ctx, model = p.calls[key]
                if (key, model) in p.credited:
                    verdict = "duplicate"
                else:
                    p.credited.add((key, model))
                    self.counts["accepted"] += 1
                    self._example(p, key, model, score)
                    self._credit(ctx, model, score)
                    return "accepted"
        self.counts[verdict] += 1
        return verdict

    # -- posteriors --------------------------------------------------------------------

    def prior(self, model: str) -> float:
        return self.priors.get(model, 0.5)

    def arm(self, context: str, model: str) -> Arm:
        """The posterior of ``model`` in ``context`` (made from its parent's when new)."""
        a = self.arms.get((context, model))
        if a is None:
            parent = parent_key(context)
            if parent == context:
                m, w = self.prior(model), self.prior_weight
            else:
                m, w = self.arm(parent, model).mean, self.prior_weight
            a = self.arms[(context, model)] = Arm(m * w, (1 - m) * w)
            while len(self.arms) > self.max_arms:
                self.arms.popitem(last=False)
        return a

    def means(self, context: str, models: Iterable[str]) -> dict[str, float]:
        return {m: self.arm(context, m).mean for m in models}

    def _example(self, p: Pending, stage: str, model: str, score: float) -> None:
        f = p.features.get(stage)
        if f is not None and self.examples.maxlen:
            self.examples.append(Example.of(f, model, score))
            self.added += 1
            if self.on_example is not None:
                self.on_example()

    def _credit(self, context: str, model: str, score: float) -> None:
        parent = parent_key(context)
        for key in (context,) if parent == context else (context, parent):  # child first
            a = self.arm(key, model)
            a.alpha += score
            a.beta += 1.0 - score
            total = a.alpha + a.beta
            if total > self.memory:  # forget: the posterior stays at most this sure
                a.alpha *= self.memory / total
                a.beta *= self.memory / total
        self.unsaved += 1
        if self.path is not None and self.unsaved >= self.save_every:
            self.save()

    # -- persistence -------------------------------------------------------------------

    def save(self) -> None:
        """The posteriors and the ledger, written atomically to ``path``."""
        assert self.path is not None
        state = {
            "format": FORMAT,
            "arms": [[c, m, a.alpha, a.beta] for (c, m), a in self.arms.items()],
            "programs": [[pid, p.first, [[s, c, m] for s, (c, m) in p.calls.items()],
                          [[s, m] for s, m in p.credited]]
                         for pid, p in self.programs.items()],
            "forgotten": list(self.forgotten),
            "features": [[pid, [[s, list(i), list(v)] for s, (i, v) in p.features.items()]]
                         for pid, p in self.programs.items() if p.features],
            "examples": [[e.indices.tolist(), e.values.tolist(), e.model, e.score]
                         for e in self.examples],
            "counts": self.counts,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.unsaved = 0

    def load(self) -> None:
        """Read ``path`` back; ValueError naming the file when it is not a book."""
        assert self.path is not None
        try:
            state = json.loads(self.path.read_text())
            if state.get("format") != FORMAT:
                raise ValueError(f"format {state.get('format')!r}, expected {FORMAT}")
            arms = OrderedDict(((str(c), str(m)), Arm(float(a), float(b)))
                               for c, m, a, b in state["arms"])
            if not all(math.isfinite(x.alpha) and math.isfinite(x.beta) and x.alpha > 0
                       and x.beta > 0 for x in arms.values()):
                raise ValueError("an arm's counts are not finite and positive")
            programs = OrderedDict(
                (str(pid), Pending(str(first), {str(s): (str(c), str(m)) for s, c, m in calls},
                                   {(str(s), str(m)) for s, m in credited}))
                for pid, first, calls, credited in state["programs"])
            forgotten = OrderedDict((str(p), None) for p in state["forgotten"])
            counts = {v: int(state["counts"].get(v, 0)) for v in VERDICTS}
            for pid, feats in state.get("features", []):
                if str(pid) in programs:
                    programs[str(pid)].features = {
                        str(s): (tuple(int(x) for x in i), tuple(float(x) for x in v))
                        for s, i, v in feats}
            examples = [Example.of((i, v), str(m), float(sc))
                        for i, v, m, sc in state.get("examples", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"online learner state {self.path}: unreadable ({e})") from None
        self.arms, self.programs, self.forgotten, self.counts = arms, programs, forgotten, counts
        self.examples.extend(examples)
        self.added = len(self.examples)
