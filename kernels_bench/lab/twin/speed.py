"""``python -m kernels_bench.lab.twin.speed``: how fast the engine twin simulates.

Every engine instance of a cluster file as a twin, with its entry's profile
(``kernels_bench profile`` output), under ``synthetic_workload``; prints simulated
requests, engine steps and virtual seconds per wall second.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from kernels_bench.lab.twin.engine_spec import engine_specs
from kernels_bench.lab.twin.request import TwinRequest
from kernels_bench.lab.twin.sim import Simulator
from kernels_bench.lab.twin.step_time import StepTimeModel, load_profile
from router.config.cluster import load_cluster_config


def synthetic_workload(seed: int, n: int, engines: list[str],
                       rate: float = 40.0) -> list[tuple[float, str, TwinRequest]]:
    """``n`` requests, Poisson arrivals at ``rate`` per second on engines chosen at random:
    half start with one shared 300-token system prompt, then 20-700 random tokens; 1-60
    output tokens; priorities 0 (none), 5, 50 or 500."""
    rng = random.Random(seed)
    system = [rng.randrange(100, 3000) for _ in range(300)]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        tail = [rng.randrange(100, 3000) for _ in range(rng.randint(20, 700))]
        prompt = (system + tail) if rng.random() < 0.5 else tail
        out.append((t, rng.choice(engines), TwinRequest(
            f"r{i}", tuple(prompt), rng.randint(1, 60), rng.choice([0, 5, 50, 500]))))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.speed",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", type=Path, required=True)
    p.add_argument("--profile", action="append", default=[], metavar="ENTRY=FILE",
                   help="the profile of each engine entry")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rate", type=float, default=40.0, help="arrivals per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--telemetry", action="store_true",
                   help="snapshots and KV events on (frames made, then dropped)")
    a = p.parse_args(argv)
    files = dict(item.split("=", 1) for item in a.profile)
    sim = Simulator()
    for spec in engine_specs(load_cluster_config(a.cluster)):
        if spec.entry not in files:
            p.error(f"no --profile for engine entry {spec.entry}")
        sim.add_engine(spec, StepTimeModel(load_profile(files[spec.entry])),
                       telemetry=a.telemetry)
    for at, engine, request in synthetic_workload(a.seed, a.requests, sorted(sim.engines),
                                                  a.rate):
        sim.submit(engine, request, at)
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    steps = sum(e.steps for e in sim.engines.values())
    print(f"{a.requests} requests, {steps} engine steps, {sim.now():.1f} virtual s in "
          f"{wall:.2f} wall s: {a.requests / wall:,.0f} requests/s, {steps / wall:,.0f} "
          f"steps/s, {sim.now() / wall:.1f} virtual s per wall s")


if __name__ == "__main__":
    main()
