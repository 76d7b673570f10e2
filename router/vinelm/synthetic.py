"""A seeded synthetic execution environment whose exhaustive ground truth is known.

Mixed-model executions of the real workflows do not exist yet (the traces hold each
model's run of each whole workflow), so sparse profiling's path-level error is measured
here. Each problem x has a difficulty d(x) ~ U(0, 1). An answering invocation at depth k
with model m succeeds, given that the answer so far is wrong, with probability

    p = sigmoid(6 x (skill[m] + 0.1 x helper - d(x) + switch))

where ``helper`` is the skill of the model of the latest non-answering invocation (plan,
review) and ``switch = 0.08`` when m differs from the previous answering model (a second
opinion helps), else 0. Non-answering invocations never succeed. Outcomes are
deterministic per (problem, prefix) (a hash-seeded uniform), success is absorbing, and
problems that fail early are harder, so cascade observations are missing not at random.
Cost and latency per invocation are the model's base values times a stage factor times
a per-(problem, prefix) jitter in [0.8, 1.2].
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from router.vinelm.profiling import Outcome
from router.vinelm.template import Invocation
from router.vinelm.trie import Path_


def _uniform(*parts: object) -> float:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


@dataclass(frozen=True)
class SyntheticEnv:
    invocations: Sequence[Invocation]
    skill: Mapping[str, float]
    cost: Mapping[str, float]
    """Base cost of one invocation per model."""
    latency_s: Mapping[str, float]
    seed: int = 0

    def difficulty(self, problem: str) -> float:
        return _uniform(self.seed, "d", problem)

    def step_success_probability(self, problem: str, prefix: Path_) -> float:
        k = len(prefix) - 1
        inv = self.invocations[k]
        if not inv.answers:
            return 0.0
        m = prefix[-1]
        helper = next((prefix[j] for j in range(k - 1, -1, -1)
                       if not self.invocations[j].answers), None)
        prev = next((prefix[j] for j in range(k - 1, -1, -1)
                     if self.invocations[j].answers), None)
        z = self.skill[m] - self.difficulty(problem)
        z += 0.1 * self.skill[helper] if helper is not None else 0.0
        z += 0.08 if prev is not None and prev != m else 0.0
        return 1.0 / (1.0 + math.exp(-6.0 * z))

    def succeeds(self, problem: str, prefix: Path_) -> bool:
        """Absorbing success after ``prefix``."""
        return any(_uniform(self.seed, "s", problem, prefix[:j])
                   < self.step_success_probability(problem, prefix[:j])
                   for j in range(1, len(prefix) + 1))

    def run(self, problem: str, prefix: Path_) -> Outcome:
        """The executor interface: the prefix's last invocation."""
        m, inv = prefix[-1], self.invocations[len(prefix) - 1]
        factor = 1.0 if inv.answers else 0.5
        jitter = 0.8 + 0.4 * _uniform(self.seed, "j", problem, prefix)
        return Outcome(self.succeeds(problem, prefix), self.cost[m] * factor * jitter,
                       self.latency_s[m] * factor * jitter)


def default_env(invocations: Sequence[Invocation], seed: int = 0) -> SyntheticEnv:
    """Two or three models with a cost/skill trade-off (the names of the invocations)."""
    models = sorted({m for inv in invocations for m in inv.models})
    n = len(models)
    skill = {m: 0.35 + 0.3 * i / max(1, n - 1) for i, m in enumerate(models)}
    cost = {m: 1.0 * 4 ** (i / max(1, n - 1)) for i, m in enumerate(models)}
    lat = {m: 1.0 * 2.5 ** (i / max(1, n - 1)) for i, m in enumerate(models)}
    return SyntheticEnv(invocations, skill, cost, lat, seed)
