"""Offline profiling (VineLM section 3.2): cascade sampling with checkpoint reuse, and
exhaustive profiling for ground truth.

An ``Executor`` runs one prefix of model choices for one problem: the prefix's last
invocation, continuing from the checkpoint its parent prefix left (the executor keeps
checkpoints; the profiler asks for every parent before its children and never asks for
one (problem, prefix) twice, so shared prefixes are executed once: checkpoint reuse).

Cascade sampling, per problem and per cascade: run a uniformly random admissible model
at depth 1; if the answer is wrong, extend the prefix with a random model at depth 2,
and so on until a success or the deepest invocation. A success at a prefix marks the
prefix's whole subtree as a success for that problem (subtree fill-in: the workflow
stops there). Success is absorbing everywhere, so exhaustive profiling records a
problem's success at every node below its first success too.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

from tqdm import tqdm

from router.vinelm.template import Invocation
from router.vinelm.trie import Path_, prefixes


@dataclass(frozen=True)
class Outcome:
    """One executed prefix: is the answer right after it, and what its last invocation
    cost and took."""

    success: bool
    cost: float
    latency_s: float


class Executor(Protocol):
    def run(self, problem: str, prefix: Path_) -> Outcome:
        """Run ``prefix[-1]`` for ``problem`` from the checkpoint of ``prefix[:-1]``."""


class MissingExecution(LookupError):
    """A table executor has no record of this (problem, prefix)."""


@dataclass
class Observations:
    """Everything profiling saw, per node."""

    runs: dict[Path_, int] = field(default_factory=lambda: defaultdict(int))
    """Executions of the node whose parent had failed (every cascade execution is one)."""
    successes: dict[Path_, int] = field(default_factory=lambda: defaultdict(int))
    cost_sum: dict[Path_, float] = field(default_factory=lambda: defaultdict(float))
    latency_sum: dict[Path_, float] = field(default_factory=lambda: defaultdict(float))
    executions: int = 0
    """Executor calls (invocations actually run)."""
    executed_cost: float = 0.0
    """Sum of the executed invocations' cost (the profiling bill)."""
    problems: int = 0

    def record(self, prefix: Path_, out: Outcome) -> None:
        self.runs[prefix] += 1
        self.successes[prefix] += out.success
        self.cost_sum[prefix] += out.cost
        self.latency_sum[prefix] += out.latency_s


class CheckpointedRunner:
    """Calls an executor at most once per (problem, prefix); counts the calls."""

    def __init__(self, executor: Executor, obs: Observations) -> None:
        self.executor, self.obs = executor, obs
        self.done: dict[tuple[str, Path_], Outcome] = {}

    def run(self, problem: str, prefix: Path_) -> tuple[Outcome, bool]:
        """The prefix's outcome and whether it was executed now (False: reused)."""
        key = (problem, prefix)
        hit = self.done.get(key)
        if hit is not None:
            return hit, False
        out = self.executor.run(problem, prefix)
        self.done[key] = out
        self.obs.executions += 1
        self.obs.executed_cost += out.cost
        return out, True


def cascade_sample(executor: Executor, invocations: Sequence[Invocation],
                   problems: Sequence[str], cascades_per_problem: int, seed: int,
                   progress: bool = False) -> Observations:
    """Cascade sampling over ``problems`` (``cascades_per_problem`` cascades each)."""
    rng = random.Random(seed)
    obs = Observations(problems=len(problems))
    runner = CheckpointedRunner(executor, obs)
    todo = [p for p in problems for _ in range(cascades_per_problem)]
    for problem in tqdm(todo, desc="cascade profiling", unit="cascade", file=sys.stderr,
                        disable=not progress):
        prefix: Path_ = ()
        for inv in invocations:
            prefix = prefix + (rng.choice(inv.models),)
            out, fresh = runner.run(problem, prefix)
            if fresh:
                obs.record(prefix, out)
            if out.success:
                break
    return obs


@dataclass(frozen=True)
class GroundTruth:
    """Exhaustive profiling: per node, the mean over problems (success absorbing)."""

    accuracy: dict[Path_, float]
    step_cost: dict[Path_, float]
    step_latency_s: dict[Path_, float]
    executions: int
    """Executor calls with checkpoint reuse (one per node run per problem)."""
    executions_without_checkpoints: int
    """Invocations if every node run re-ran its whole prefix."""
    executed_cost: float


def exhaustive(executor: Executor, invocations: Sequence[Invocation],
               problems: Iterable[str], progress: bool = False,
               stop_at_success: bool = False) -> GroundTruth:
    """Run every node for every problem (parents first, each once). With
    ``stop_at_success`` nothing below a success runs (the workflow stopped there; a
    recorded real execution has nothing else): such nodes count as successes, and step
    cost and latency are means over the problems that ran the node."""
    problems = list(problems)
    nodes = list(prefixes(invocations))
    succ: dict[Path_, int] = defaultdict(int)
    ran: dict[Path_, int] = defaultdict(int)
    cost: dict[Path_, float] = defaultdict(float)
    lat: dict[Path_, float] = defaultdict(float)
    executed_cost = 0.0
    executions = 0
    for problem in tqdm(problems, desc="exhaustive profiling", unit="problem",
                        file=sys.stderr, disable=not progress):
        ok: dict[Path_, bool] = {(): False}
        for p in nodes:
            if stop_at_success and ok[p[:-1]]:
                ok[p] = True
                succ[p] += 1
                continue
            out = executor.run(problem, p)
            ok[p] = ok[p[:-1]] or out.success
            succ[p] += ok[p]
            ran[p] += 1
            cost[p] += out.cost
            lat[p] += out.latency_s
            executed_cost += out.cost
            executions += 1
    n = max(1, len(problems))
    return GroundTruth({p: succ[p] / n for p in nodes},
                       {p: cost[p] / max(1, ran[p]) for p in nodes},
                       {p: lat[p] / max(1, ran[p]) for p in nodes}, executions,
                       sum(len(p) * ran[p] for p in nodes), executed_cost)
