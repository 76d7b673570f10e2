"""Workflow arrival times: Poisson, or gamma-distributed gaps for bursty traffic.

Gaps between arrivals are gamma distributed with mean 1/rate and coefficient of
variation cv: shape k = 1/cv^2, scale theta = 1/(rate x k). cv = 1 is the Poisson process
(exponential gaps); cv > 1 is burstier. The first workflow arrives at 0.
"""

from __future__ import annotations

import numpy as np

PROCESSES = ("poisson", "gamma")


def gamma_shape_scale(rate: float, cv: float) -> tuple[float, float]:
    """(k, theta) = (1/cv^2, 1/(rate k)): mean gap 1/rate, coefficient of variation cv."""
    k = 1.0 / cv**2
    return k, 1.0 / (rate * k)


def arrival_times(n: int, rate: float, process: str, cv: float, seed: int) -> list[float]:
    """``n`` arrival times in seconds (the first at 0) at ``rate`` workflows per second."""
    if process not in PROCESSES:
        raise ValueError(f"arrival process {process!r}: use one of {', '.join(PROCESSES)}")
    if not rate > 0:
        raise ValueError(f"arrival rate must be > 0, got {rate}")
    if process == "gamma" and not cv > 0:
        raise ValueError(f"--cv must be > 0, got {cv}")
    if n <= 0:
        return []
    k, theta = gamma_shape_scale(rate, 1.0 if process == "poisson" else cv)
    gaps = np.random.default_rng(seed).gamma(k, theta, size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]
