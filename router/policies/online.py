"""``online``: a model chooser that starts from nothing (or priors) and learns each model's
success from the outcomes its own traffic reports (issue 59).

Context of a program's first call: its workflow, stage and prompt length bucket
(``length_bucket``: log2 of the prompt's tokens). Per (context, model) a Beta posterior
of success (``router.state.outcomes.OutcomeBook``), a context's prior taken from its
workflow's arm; with ``neighbours`` the posterior also counts the nearest credited
prompts (``Neighbours.posteriors``: on math a problem's template). A first call takes each
model's q[m] = posterior mean + ``explore`` x (a Thompson draw - the mean) and walks
Chimera's Algorithm 1 (``chimera.select_model``) on q over the models' expected finish
times (``chimera.finish_times``: congestion L[m] plus ``mean_output_tokens`` decode steps),
its margin delta_s the quantile of recent gains (``ShareHold``: Chimera's ``ShareMargin``
at a share that leans against the realised one) so that about ``target_share`` of first
calls go past the fastest model (the big model's share on a two-model cluster), the slack
``tau`` gating each. A program's later stages keep its model (stickiness, as Chimera's);
a retry goes to a model its stage has not tried.

What it learns from: a retry's ``tried_models`` (each failed the stage's check) and the
agent's reports (``POST /v1/hetserve/outcomes``), each credited once to the arm of the call
it judges. Exploration is bounded two ways: the share of big-model calls is the target's
whatever the draws (exploration only chooses *which* programs get the big model, so
before any outcome, every mean equal, it is ``random_mix`` at ``target_share``), and
``memory`` caps an arm's pseudo counts, so no posterior becomes certain and a changed
workload is relearned.
The engine within the model is the ``picker`` setting's (default ``least_loaded``).
"""

from __future__ import annotations

import itertools
import math
import random
import re
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import field
from typing import Annotated, Any

import numpy as np
from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from router.policies.base import (
    BuildPolicy,
    PickerPolicy,
    decision,
    models_of,
    of_model,
)
from router.policies.chimera import ShareMargin, first_done, model_latency
from router.policies.pickers import PickerName
from router.predictors.lexical import masked
from router.settings import STRICT, Count, NonNegative, Positive, PositiveInt
from router.state.outcomes import Features, OutcomeBook, context_key
from router.state.view import EngineView, StateView
from router.types import ClusterInfo, Decision, RoutingRequest

Open = Annotated[float, Field(gt=0, lt=1)]
DIMS = 4096
"""Feature buckets (as the lexical encoder's, ``router.predictors.lexical``)."""
MAX_CHARS = 2048
STOP_SHARE, STOP_MIN = 0.05, 20
"""A bucket held by more than this share of the examples (and this many) is left out of
the similarity (a stop word: what the lexical encoder's idf weighs down)."""
"""Text past this many characters is not hashed."""
WORD = re.compile(r"(?u)\b\w\w+\b")
"""scikit-learn's token pattern: words of two characters or more (masked numbers drop)."""


@pydantic_dataclass(frozen=True, config=STRICT)
class OnlineSettings:
    target_share: Open = 0.3
    """Share of first calls sent past the fastest model (the big model's share of programs
    on two models): delta_s is the (1 - target_share) quantile of the last
    ``share_window`` sampled gains (Chimera's ``ShareMargin``)."""
    share_window: Annotated[int, Field(ge=1, le=100_000)] = 50
    """How many recent sampled gains the quantile is taken over (and first calls the
    realised share of ``share_correction`` is counted over). Default chosen on the tuning
    problems (docs/research/online.md, "Tuning"): a short window follows the learner's
    climbing gains."""
    share_correction: Annotated[float, Field(ge=0, le=100)] = 1.0
    """How hard the quantile's share leans against the realised one (``ShareHold``): the
    quantile is taken at share target - ``share_correction`` x (realised - target), so a
    learner whose gains climb faster than the window follows (its new gains all above
    the old quantile) still sends about ``target_share``; 0: Chimera's quantile alone.
    Default chosen on the tuning problems (3 oscillated)."""
    tau: NonNegative = 0.2
    """Latency slack of Algorithm 1 (Chimera's ``tau``): a model other than the fast one
    is taken only while its congestion L[m] (Chimera's ``model_latency``) is at most
    (1 + tau) x the fast model's + ``slack_ms``."""
    slack_ms: NonNegative = 1000.0
    """The slack's absolute part (ms of queued decode): on an idle or lightly loaded
    cluster L[m] is about 0 for the fast model, and a purely relative slack would shut the
    big model out."""
    prior_weight: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """Pseudo counts of a new arm's prior (its workflow's arm's mean, or ``priors``), and
    of the context's arm under the neighbours' counts (``Neighbours.posteriors``): the
    smaller, the sooner outcomes move it. Default chosen on the tuning problems
    (docs/research/online.md, "Tuning")."""
    memory: Annotated[float, Field(ge=2, le=1e9)] = 400.0
    """Most pseudo counts an arm keeps (older ones fade in proportion): the floor of
    exploration and the speed of relearning after the workload changes."""
    priors: dict[str, Open] = field(default_factory=dict)
    """Prior success per model (default 0.5 each: nothing known)."""
    length_buckets: Annotated[int, Field(ge=1, le=64)] = 16
    """Prompt length buckets (log2 of prompt tokens, the last one open)."""
    mean_output_tokens: dict[str, Positive] = field(default_factory=dict)
    """A program's expected output tokens per model for its finish time (default 1: the
    models compared by decode speed alone)."""
    decode_ms_per_token: dict[str, Positive] = field(default_factory=dict)
    """Per model, where no profile is given (``router.predictors.profiles``); default 1."""
    max_batch_size: dict[str, PositiveInt] = field(default_factory=dict)
    """Per model, where no profile is given; default 1."""
    state_file: Annotated[str, Field(max_length=4096)] | None = None
    """Where the learned posteriors are kept (written atomically, read at start); None:
    in memory only."""
    save_every: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    """Write the state after this many credits (1: a restart loses none)."""
    max_programs: Annotated[int, Field(ge=1, le=10_000_000)] = 100_000
    """Programs whose calls an outcome may still credit (older are forgotten: late)."""
    neighbours: Annotated[int, Field(ge=0, le=1000)] = 20
    """k > 0: a model's draw also counts, per model, the k credited calls whose prompts
    (the user's text hashed as the lexical encoder's: words and word pairs, numbers
    masked, no fitted weights; ``Neighbours.features``) are nearest this one's, each weighing
    exp((similarity - 1) / ``temperature``) pseudo counts over the context's arm scaled to
    ``prior_weight`` (an online KNN, on math recognising a problem's template); 0: the
    context's arm alone."""
    temperature: Annotated[float, Field(gt=0, le=10)] = 0.2
    """How fast a neighbour's weight falls with its cosine distance (the weight's formula:
    ``neighbours``). Default chosen on the tuning problems."""
    max_examples: Annotated[int, Field(ge=1, le=100_000)] = 2000
    """Credited calls kept as neighbours (oldest leave first)."""
    reindex_every: Annotated[int, Field(ge=1, le=100_000)] = 8
    """Rebuild the neighbours' index after this many new examples (the newest wait; the
    rebuild runs on the outcome path, never a decision's)."""
    explore: Annotated[float, Field(gt=0, le=10)] = 0.02
    """The Thompson draw's spread: a model's q is its posterior mean plus ``explore`` x
    (its Beta draw - the mean) (``Online._draws``, the one place of this formula); 1:
    plain Thompson sampling; small: the posterior mean ranks the programs, the draw only
    breaks its ties (before any outcome every mean is equal, and the draws alone decide:
    ``random_mix`` at ``target_share``). Which programs explore is the draw's; how many
    go past the fast model is the share's quantile whatever ``explore`` is. Default
    chosen on the tuning problems (docs/research/online.md, "Tuning": 1 gained +1.2
    points there, 0.003-0.05 +4.2 to +4.6)."""
    seed: Count = 0
    """Seed of the Thompson draws."""
    picker: PickerName = "least_loaded"
    """The engine picker that chooses among the chosen model's engines."""


class Online(PickerPolicy[OnlineSettings]):
    name = "online"
    program_affinity = True
    Settings = OnlineSettings
    default_picker = "least_loaded"
    inputs = frozenset({"model_inflight_tokens", "program_model"})

    def __init__(self, settings: OnlineSettings, cluster: ClusterInfo, predictors: Any,
                 build: BuildPolicy) -> None:
        super().__init__(settings, cluster, predictors, build)
        s, models = settings, cluster.models
        profiles = getattr(predictors, "profiles", None) or {}
        self.decode_ms = {m: profiles[m].decode_ms_per_token if m in profiles else
                          s.decode_ms_per_token.get(m, 1.0) for m in models}
        self.max_batch = {m: profiles[m].max_batch_size if m in profiles else
                          s.max_batch_size.get(m, 1) for m in models}
        self.sources["profile"] = "predictor" if profiles else "static_prior"
        self.tokens = {m: s.mean_output_tokens.get(m, 1.0) for m in models}
        self.book = OutcomeBook(s.state_file, max_programs=s.max_programs,
                                prior_weight=s.prior_weight, memory=s.memory,
                                priors=s.priors, save_every=s.save_every,
                                max_examples=s.max_examples if s.neighbours else 0)
        """The learner: what outcomes taught (``router.routes.outcomes`` reports to it)."""
        self.margin = ShareHold(s.target_share, s.share_window, s.share_correction)
        self.rng = random.Random(s.seed)
        self.lexical = None if not s.neighbours else Neighbours(self.book, s)
        if self.lexical is not None:
            self.book.on_example = self.lexical.added

    def context(self, req: RoutingRequest) -> str:
        w = req.workflow
        n = req.num_prompt_tokens or len(req.prompt_text) // 4
        bucket = min(self.settings.length_buckets - 1, int(math.log2(n + 1)))
        return context_key(w.workflow, w.stage, bucket)

    def decide(self, req: RoutingRequest, cands: Sequence[EngineView], view: StateView,
               pred: Any) -> Decision:
        w = req.workflow
        stage = str(w.stage_index or 0) if w.stage is None else w.stage
        ctx = self.context(req)
        feats = None
        if self.lexical is not None and not w.tried_models and view.program_model(
                w.program_id) is None:  # a program's first call: its model is chosen
            feats = self.lexical.features(req.user_text or req.prompt_text)
        if w.tried_models:
            self.book.retry(w.program_id, stage, ctx, w.tried_models)
        models = models_of(cands)
        assigned = view.program_model(w.program_id)
        if assigned in models and not w.tried_models:
            model, how = assigned, "sticky"
        else:
            model, how = self._select(ctx, models, view, set(w.tried_models), feats), \
                "sampled"
        self.book.note(w.program_id, stage, ctx, model, feats)
        pick = self.picker.pick(req, of_model(cands, model), view)
        return decision(req, pick.engine, self.name,
                        info={"context": ctx, "how": how, **pick.info})

    def _select(self, ctx: str, models: list[str], view: StateView, tried: set[str],
                feats: Features | None = None) -> str:
        """Algorithm 1's walk on Thompson draws: the fast model (least expected finish
        time, ``chimera.first_done``) unless a model within the slack draws a success
        ``delta_s`` above it (delta_s from the share's quantile on first calls)."""
        s = self.settings
        congestion = {m: model_latency(view.model_inflight_tokens(m), self.decode_ms[m],
                                       self.max_batch[m]) for m in models
                      if m not in tried} or {m: 0.0 for m in models}
        if len(congestion) < len(models):
            congestion = {m: model_latency(view.model_inflight_tokens(m), self.decode_ms[m],
                                           self.max_batch[m]) for m in congestion}
        base = first_done(congestion, self.tokens, self.decode_ms)
        if feats is not None and self.lexical is not None:
            q = self._draws(self.lexical.posteriors(ctx, feats, list(congestion)))
        else:
            q = self._draws({m: (a.alpha, a.beta) for m in congestion
                             for a in (self.book.arm(ctx, m),)})
        delta_s = 0.0
        gain = max((q[m] - q[base] for m in q if m != base), default=None)
        first = not tried and gain is not None  # a first call: the share holds over these
        if first:
            delta_s = self.margin.next(gain)
        limit = (1 + s.tau) * congestion[base] + s.slack_ms
        chosen = base
        for m in sorted(q, key=lambda m: (-q[m], congestion[m], m)):
            if m != base and congestion[m] <= limit and q[m] >= q[base] + delta_s:
                chosen = m
                break
        if first:
            self.margin.went(chosen != base)
        return chosen

    def _draws(self, posteriors: dict[str, tuple[float, float]]) -> dict[str, float]:
        """Per model, q = mean + ``explore`` x (Beta(alpha, beta) draw - mean)."""
        e, q = self.settings.explore, {}
        for m, (a, b) in posteriors.items():
            mean = a / (a + b)
            q[m] = mean + e * (self.rng.betavariate(a, b) - mean)
        return q


class ShareHold:
    """delta_s: Chimera's ``ShareMargin`` quantile, taken at the share
    clip(target - correction x (realised - target), 0.01, 0.99), realised being the share
    of the last ``window`` first calls sent past the fast model (the ``share_correction``
    setting; the one place of this formula)."""

    def __init__(self, target: float, window: int, correction: float) -> None:
        self.target, self.correction = target, correction
        self.quantile = ShareMargin(target, window, 1.0)
        self.sent: deque[bool] = deque(maxlen=window)
        self.past = 0
        """How many of ``sent`` went past the fast model."""

    def next(self, gain: float) -> float:
        if self.correction and self.sent:
            realised = self.past / len(self.sent)
            self.quantile.share = min(0.99, max(0.01, self.target - self.correction * (
                realised - self.target)))
        return self.quantile.next(gain)

    def went(self, past: bool) -> None:
        """A first call went past the fast model (or not)."""
        if len(self.sent) == self.sent.maxlen:
            self.past -= self.sent[0]
        self.sent.append(past)
        self.past += past


class Neighbours:
    """The ``neighbours`` setting: the book's examples, indexed by their features'
    buckets (postings sorted by bucket, rebuilt every ``reindex_every`` new examples on
    the outcome path), searched by cosine similarity."""

    def __init__(self, book: OutcomeBook, settings: OnlineSettings) -> None:
        self.book, self.settings = book, settings
        self.indexed = -1
        self.indptr = np.zeros(DIMS + 1, np.int64)
        self.ex = np.zeros(0, np.int32)
        self.val = np.zeros(0)
        """Postings: bucket b's examples are ``ex[indptr[b]:indptr[b + 1]]``, with their
        weights ``val``."""
        self.mine: dict[str, np.ndarray] = {}
        """Per model, its examples' positions."""
        self.scores: np.ndarray = np.array([])
        self.stop = np.zeros(DIMS, bool)
        """Buckets held by more than ``STOP_SHARE`` of the examples: left out."""

    @staticmethod
    def features(text: str) -> Features:
        """The text's words and word pairs, numbers masked, hashed (crc32) into ``DIMS``
        buckets as the lexical encoder's are, weighed 1 + log(count), L2-normalised."""
        words = WORD.findall(masked(text[:MAX_CHARS]))
        counts: dict[int, int] = {}
        for gram in itertools.chain(words, map(" ".join, itertools.pairwise(words))):
            b = zlib.crc32(gram.encode()) % DIMS
            counts[b] = counts.get(b, 0) + 1
        idx = sorted(counts)
        val = [1.0 + math.log(counts[b]) for b in idx]
        norm = math.sqrt(sum(v * v for v in val)) or 1.0
        return tuple(idx), tuple(v / norm for v in val)

    def _reindex(self) -> None:
        """The bucket -> examples postings (CSR arrays, sorted by bucket), stop words
        left out, each example's vector renormalised over the rest."""
        es = list(self.book.examples)
        models = np.array([e.model for e in es])
        self.mine = {m: np.flatnonzero(models == m) for m in set(models.tolist())}
        self.scores = np.array([e.score for e in es])
        self.indexed = self.book.added
        if not es:
            return
        col = np.repeat(np.arange(len(es), dtype=np.int32), [len(e.indices) for e in es])
        idx = np.concatenate([e.indices for e in es])
        val = np.concatenate([e.values for e in es]).astype(np.float64)
        df = np.bincount(idx, minlength=DIMS)
        self.stop = df > max(STOP_MIN, STOP_SHARE * len(es))
        val[self.stop[idx]] = 0.0  # a word most prompts hold tells nothing apart
        norms = np.sqrt(np.bincount(col, weights=val ** 2, minlength=len(es)))
        val /= np.maximum(norms, 1e-9)[col]
        keep = val > 0
        idx, col, val = idx[keep], col[keep], val[keep]
        order = np.argsort(idx, kind="stable")
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(idx, minlength=DIMS))])
        self.ex, self.val = col[order], val[order]

    def added(self) -> None:
        """The book credited an example: the postings rebuilt every ``reindex_every``
        (on the outcome's path, not a decision's)."""
        if self.book.added - self.indexed >= self.settings.reindex_every:
            self._reindex()

    def _similarity(self, feats: Features) -> np.ndarray:
        """Cosine similarity of every example with ``feats`` over the buckets that are not
        stop words: the postings of its buckets gathered and summed (``np.bincount``)."""
        q, qv = np.asarray(feats[0]), np.asarray(feats[1])
        kept = ~self.stop[q]
        q, qv = q[kept], qv[kept]
        qv = qv / max(float(np.sqrt(qv @ qv)), 1e-9)
        indptr, ex, val = self.indptr, self.ex, self.val
        starts, lengths = indptr[q], indptr[q + 1] - indptr[q]
        total = int(lengths.sum())
        offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        pos = np.arange(total) + offsets
        weights = val[pos] * np.repeat(qv, lengths)
        return np.bincount(ex[pos], weights=weights, minlength=len(self.scores))

    def posteriors(self, ctx: str, feats: Features, models: list[str]
                   ) -> dict[str, tuple[float, float]]:
        """Per model, the Beta (alpha, beta): the context's arm scaled to
        ``prior_weight``, plus the k nearest examples' weighted successes and failures."""
        s = self.settings
        if self.indexed < 0:  # restored from the state file
            self._reindex()
        sim = None
        if len(self.scores) and feats[0]:
            sim = self._similarity(feats)
        out = {}
        for m in models:
            arm = self.book.arm(ctx, m)
            a, b = arm.mean * s.prior_weight, (1 - arm.mean) * s.prior_weight
            if sim is not None:
                mine = self.mine.get(m, ())
                if len(mine):
                    k = min(s.neighbours, len(mine))
                    top = mine[np.argpartition(-sim[mine], k - 1)[:k]]
                    w = np.exp((sim[top] - 1.0) / s.temperature)
                    a += float(w @ self.scores[top])
                    b += float(w.sum() - w @ self.scores[top])
            out[m] = (max(a, 1e-6), max(b, 1e-6))
        return out
