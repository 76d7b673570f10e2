"""``python -m kernels_bench scheduler``: cost of one ``schedule()`` call, ours vs vLLM's.

For each waiting-queue size N (default 10, 100, 1,000, 10,000) it builds, with no model
executor (``lib.scheduler_harness``), vLLM's stock priority scheduler and our STJF and MLFQ
schedulers, fills each with the same requests, and times ``schedule()``:

- ``full``: the batch is full (``max_num_seqs`` requests decoding), N requests wait and
  cannot be admitted: the steady cost of carrying a long queue, aging included.
- ``churn``: every running request finishes after one token, so each step admits
  ``max_num_seqs`` new requests from the N waiting (refilled to N): the admission path.

Schedulers are timed in interleaved rounds so machine noise hits all alike; the table
shows median and p99 per call and the ratio of medians against vLLM's priority
scheduler measured in the same run. JSON and a PNG plot go to ``--out``.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

from kernels_bench.lib.scheduler_harness import fake_output, make_request, make_scheduler

SIZES = (10, 100, 1_000, 10_000)


def _contenders() -> dict[str, tuple[type, str]]:
    from vllm.v1.core.sched.scheduler import Scheduler

    from scheduler_patches.mlfq import MLFQScheduler
    from scheduler_patches.stjf import STJFScheduler

    return {
        "vllm-priority": (Scheduler, "priority"),
        "stjf": (STJFScheduler, "priority"),
        "mlfq": (MLFQScheduler, "priority"),
    }


class _Run:
    """One scheduler filled for a scenario; ``timed_step()`` times one schedule()."""

    def __init__(self, cls: type, policy: str, scenario: str, n_waiting: int,
                 max_num_seqs: int, seed: int) -> None:
        self.scenario = scenario
        self.n_waiting = n_waiting
        self.rng = random.Random(seed)
        self.counter = 0
        self.sched = make_scheduler(cls, policy=policy, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max(8192, 16 * max_num_seqs),
                                    num_blocks=4 * (n_waiting + 4 * max_num_seqs) + 64)
        long_tokens = 10**6 if scenario == "full" else 1
        for _ in range(max_num_seqs):
            self._add(max_tokens=long_tokens, priority=1)
        self._step()  # admit the first batch
        for _ in range(n_waiting):
            self._add(max_tokens=long_tokens if scenario == "full" else 1)

    def _add(self, max_tokens: int, priority: int | None = None) -> None:
        self.counter += 1
        prio = priority if priority is not None else self.rng.randint(2, 100_000)
        self.sched.add_request(make_request(
            f"r{self.counter}", prompt_len=8, max_tokens=max_tokens, priority=prio,
            arrival_time=float(self.counter), first_token=self.counter))

    def _step(self) -> float:
        t0 = time.perf_counter()
        out = self.sched.schedule()
        elapsed = time.perf_counter() - t0
        self.sched.update_from_output(out, fake_output(self.sched, out))
        return elapsed

    def timed_step(self) -> float:
        elapsed = self._step()
        if self.scenario == "churn":
            for _ in range(self.n_waiting - len(self.sched.waiting)):
                self._add(max_tokens=1)
        return elapsed


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(sizes: tuple[int, ...], steps: int, max_num_seqs: int, seed: int) -> list[dict[str, Any]]:
    from tqdm import tqdm

    contenders = _contenders()
    rows: list[dict[str, Any]] = []
    cases = [(sc, n) for sc in ("full", "churn") for n in sizes]
    for scenario, n in tqdm(cases, desc="scheduler bench", unit="case"):
        runs = {name: _Run(cls, pol, scenario, n, max_num_seqs, seed)
                for name, (cls, pol) in contenders.items()}
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(steps):
            for name, r in runs.items():
                samples[name].append(r.timed_step())
        base = statistics.median(samples["vllm-priority"])
        for name, xs in samples.items():
            med = statistics.median(xs)
            rows.append({"scenario": scenario, "waiting": n, "scheduler": name,
                         "median_us": med * 1e6, "p99_us": _percentile(xs, 0.99) * 1e6,
                         "ratio_vs_vllm": med / base, "steps": steps})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'scenario':8} {'waiting':>8} {'scheduler':14} {'median us':>10} {'p99 us':>10} "
          f"{'x vllm':>7}")
    for r in rows:
        print(f"{r['scenario']:8} {r['waiting']:>8} {r['scheduler']:14} {r['median_us']:>10.1f} "
              f"{r['p99_us']:>10.1f} {r['ratio_vs_vllm']:>7.2f}")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, scenario in zip(axes, ("full", "churn")):
        for name in sorted({r["scheduler"] for r in rows}):
            pts = [(r["waiting"], r["median_us"]) for r in rows
                   if r["scenario"] == scenario and r["scheduler"] == name]
            ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("waiting requests")
        ax.set_title(f"schedule() median, {scenario}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("microseconds per call")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
