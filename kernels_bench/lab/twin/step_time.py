"""How long an engine step takes in the twin: the engine's profile, interpolated.

The profile is the per-entry file ``python -m kernels_bench profile`` writes
(``<entry>.json``): ``decode_curve`` cells (batch size, prompt length, median step time
and its p10/p90), ``decode_tokens`` (tokens each profiled request generated) and
``prefill_ms_per_token`` (the slope of prefill latency against prompt length), and
optionally ``prefill_attention_ms_per_pair`` (prefill's attention term, growing with the
context a new token attends to). ``step_ms`` holds the formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

Ms = Annotated[float, msgspec.Meta(gt=0.0, le=1e9)]
NonNegMs = Annotated[float, msgspec.Meta(ge=0.0, le=1e9)]
MAX_SLOWDOWN = 1000.0
"""Largest slowdown K of ``StepTimeModel.step_ms``."""
Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: ln(p90 / p10) = 2 Z90 sigma for a lognormal."""


class ProfileCell(msgspec.Struct, frozen=True):
    """One decode cell of a profile (``predictors.profile.Cell``)."""

    batch_size: Annotated[int, msgspec.Meta(ge=1)]
    context_tokens: Annotated[int, msgspec.Meta(ge=0)]
    step_ms: Ms
    step_ms_p10: Ms
    step_ms_p90: Ms


class EngineProfile(msgspec.Struct, frozen=True):
    """The fields of a profile file the twin reads (others are ignored)."""

    decode_curve: Annotated[list[ProfileCell], msgspec.Meta(min_length=1)]
    decode_tokens: Annotated[int, msgspec.Meta(ge=0)]
    prefill_ms_per_token: NonNegMs
    prefill_attention_ms_per_pair: NonNegMs = 0.0
    """A of ``StepTimeModel.step_ms``: prefill time per (new token, attended token) pair,
    the attention that grows with context; 0 (profiles without it): prefill linear in
    tokens, as measured, attention's growth left out."""
    modelled: str | None = None
    """Set in a modelled profile (``roofline.modelled_file``: ``"roofline <preset>"``);
    absent from a measured one."""


def load_profile(path: str | Path) -> EngineProfile:
    """A profile file, validated (msgspec's error names the field that is wrong)."""
    return msgspec.json.decode(Path(path).read_bytes(), type=EngineProfile)


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Piecewise linear through (xs, ys), sorted xs; the end segments extended beyond
    the ends (one point: constant)."""
    if len(xs) == 1:
        return float(ys[0])
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class _Row:
    """The cells of one profiled context, by batch size."""

    context: float
    batches: np.ndarray
    ms: np.ndarray
    sigma: np.ndarray


class StepTimeModel:
    """Step time of one engine from its profile, with optional lognormal jitter."""

    def __init__(self, profile: EngineProfile, jitter: bool = False, seed: int = 0,
                 slowdown: float = 1.0) -> None:
        """``slowdown``: K of ``step_ms``, 1 for an engine with its cores to itself."""
        if not 0 < slowdown <= MAX_SLOWDOWN:
            raise ValueError(f"slowdown {slowdown}: must be in (0, {MAX_SLOWDOWN:g}]")
        self.slowdown = slowdown
        self.prefill_ms_per_token = profile.prefill_ms_per_token
        self.prefill_attention_ms_per_pair = profile.prefill_attention_ms_per_pair
        by_ctx: dict[int, list[ProfileCell]] = {}
        for c in profile.decode_curve:
            by_ctx.setdefault(c.context_tokens, []).append(c)
        self._rows = []
        for ctx in sorted(by_ctx):
            cells = sorted(by_ctx[ctx], key=lambda c: c.batch_size)
            if len({c.batch_size for c in cells}) != len(cells):
                raise ValueError(f"profile: two decode cells at batch and context {ctx}")
            self._rows.append(_Row(
                context=ctx + profile.decode_tokens / 2,
                batches=np.array([c.batch_size for c in cells], float),
                ms=np.array([c.step_ms for c in cells]),
                sigma=np.array([math.log(max(c.step_ms_p90, c.step_ms_p10) / c.step_ms_p10)
                                / (2 * Z90) for c in cells]),
            ))
        self._contexts = np.array([r.context for r in self._rows])
        self._rng = np.random.default_rng(seed) if jitter else None

    def decode_ms(self, batch: int, context: float) -> tuple[float, float]:
        """(median step ms, lognormal sigma) of a decode step: interpolated in batch within
        each profiled context, then in context between them (``_interp``)."""
        at = [(_interp(batch, r.batches, r.ms), _interp(batch, r.batches, r.sigma))
              for r in self._rows]
        ms = _interp(context, self._contexts, np.array([a[0] for a in at]))
        sigma = _interp(context, self._contexts, np.array([a[1] for a in at]))
        return max(ms, 0.0), max(sigma, 0.0)

    def step_ms(self, decode_contexts: list[int], prefill_tokens: int,
                prefill_pairs: float = 0.0) -> float:
        """Duration of one engine step, in ms::

            step_ms = K x (D(b, c) x J  +  P x n  +  A x sum_i n_i x (c_i + n_i / 2))

        - b = ``len(decode_contexts)``, the requests that decode one token in the step;
          c = their mean context (tokens already computed, plus the one decoded);
        - D(b, c) = the profile's median decode step time, linear in the batch size
          between measured batches and in context between measured contexts (a profiled
          cell's context is its prompt length plus half the tokens it decoded, its mean
          context while measured); the end segments extend beyond the measured range
          (linearly: a decode step reads every context token's K and V once, so its cost
          is linear in context, as the roofline's);
          D = 0 when nothing decodes (b = 0);
        - J = 1, or with jitter exp(sigma Z), Z ~ N(0, 1) from the seeded generator and
          sigma = ln(p90 / p10) / (2 x 1.2816), the lognormal of the cell's p10 and p90
          (interpolated like D): the measured spread around the median;
        - P = ``prefill_ms_per_token``, n = prompt tokens computed in the step (prefix
          cache hits excluded, chunks as scheduled; recomputation after a preemption
          counts as prefill);
        - A = ``prefill_attention_ms_per_pair``: request i's chunk of n_i new tokens on
          top of c_i tokens already computed (cached or earlier chunks) attends to
          c_i + n_i / 2 keys per new token on average, so its attention FLOPs grow as
          n_i (c_i + n_i / 2); ``prefill_pairs`` is that sum over the step's prefill
          chunks. A = 0 (the default): prefill linear in tokens;
        - K = ``slowdown``: 1, or what sharing the engine's cores costs where the
          profile was measured alone (the live replay's API servers, router and client
          on the same 2 cores; ``kernels_bench.lab.twin.calibrate`` fits it on training
          problems).

        Not modelled: the prefill fit's intercept (``prefill_fixed_ms``: per-request
        HTTP, tokenization and sampling outside the engine step); with A = 0, attention's
        growth with context during prefill."""
        decode = 0.0
        if decode_contexts:
            ms, sigma = self.decode_ms(len(decode_contexts),
                                       sum(decode_contexts) / len(decode_contexts))
            jitter = 1.0 if self._rng is None else math.exp(sigma * self._rng.standard_normal())
            decode = ms * jitter
        return self.slowdown * (decode + self.prefill_ms_per_token * prefill_tokens
                                + self.prefill_attention_ms_per_pair * prefill_pairs)
