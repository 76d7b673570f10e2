"""``python -m kernels_bench predictors``: per-request latency of each trained predictor,
alone (a direct batched call) and through the batched service, at batch 1, 16 and 64.

Alone: one call with a batch of B requests; a request's latency is the call's. Service:
B concurrent single-request calls (what the router's event loop does), batched by the
collector and run in the worker pool; a request's latency is its own await. Requests are
built from ``--data`` records (the artifacts' training data). Writes JSON and a PNG.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import numpy as np
from tqdm import tqdm

from router.predictors.base import TpotQuery
from router.predictors.loader import close_predictors, load_predictors
from router.predictors.records import StageRecord
from router.predictors.service import SERVED, ServiceSettings
from router.request import Workflow
from router.types import RoutingRequest

METHOD = {"semantic_router": "confidence", "length": "remaining_tokens", "knn": "estimate",
          "capability": "capability"}


def to_request(r: StageRecord, i: int) -> RoutingRequest:
    return RoutingRequest(f"bench-{i}", None, prompt_text=r.prompt_text,
                          system_text=r.system_text, user_text=r.user_text,
                          num_prompt_tokens=r.prompt_tokens,
                          workflow=Workflow(workflow=r.workflow, stage=r.stage,
                                            stage_index=r.stage_index,
                                            num_stages=r.num_stages))


def percentiles(ms: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(np.mean(ms)), "samples": len(ms)}


async def alone(call: Callable[[list[RoutingRequest]], Awaitable[Any]],
                batches: list[list[RoutingRequest]]) -> list[float]:
    """Per-request latency (ms) of direct batched calls: each request waits for its call."""
    out = []
    for batch in batches:
        t0 = time.perf_counter()
        await call(batch)
        out += [1e3 * (time.perf_counter() - t0)] * len(batch)
    return out


async def served(call: Callable[[list[RoutingRequest]], Awaitable[Any]],
                 batches: list[list[RoutingRequest]]) -> list[float]:
    """Per-request latency (ms) of concurrent single-request calls through the service."""
    async def one(r: RoutingRequest) -> float:
        t0 = time.perf_counter()
        await call([r])
        return 1e3 * (time.perf_counter() - t0)

    out: list[float] = []
    for batch in batches:
        out += await asyncio.gather(*(one(r) for r in batch))
    return out


def tpot_alone(heads: Any, engines: Sequence[str], b: int, repeats: int) -> list[float]:
    queries = [TpotQuery(engines[i % len(engines)], 8 + i % 24, 100 * i, 64 * i, 0.01 * i)
               for i in range(b)]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        heads.tpot_ms(queries)
        out += [1e3 * (time.perf_counter() - t0)] * b
    return out


def bench(paths: dict[str, str], records: Sequence[StageRecord], sizes: Sequence[int],
          repeats: int, service: ServiceSettings) -> dict[str, Any]:
    models = sorted({r.model for r in records})
    reqs = [to_request(r, i) for i, r in enumerate(records)]
    direct = load_predictors(paths, models)
    behind = load_predictors({k: v for k, v in paths.items() if k in SERVED}, models,
                             service=service)
    results: dict[str, Any] = {}
    try:
        for name in tqdm(sorted(paths), desc="predictors"):
            results[name] = {}
            for b in sizes:
                batches = [[reqs[(k * b + i) % len(reqs)] for i in range(b)]
                           for k in range(repeats)]
                if name == "tpot":
                    engines = sorted(getattr(direct, name).engines)
                    results[name][b] = {"alone": percentiles(tpot_alone(
                        direct.tpot, engines, b, repeats))}
                    continue
                call_d = getattr(getattr(direct, name), METHOD[name])
                call_s = getattr(getattr(behind, name), METHOD[name])
                asyncio.run(alone(call_d, batches[:1]))  # warm-up
                asyncio.run(served(call_s, batches[:1]))
                results[name][b] = {"alone": percentiles(asyncio.run(alone(call_d, batches))),
                                    "service": percentiles(asyncio.run(served(call_s,
                                                                              batches)))}
    finally:
        close_predictors(behind)
    return results


def table(results: dict[str, Any]) -> str:
    lines = ["| predictor | batch | alone p50 / p99 (ms per request) | service p50 / p99 |",
             "|---|---|---|---|"]
    for name, by_b in results.items():
        for b, r in by_b.items():
            a = r["alone"]
            s = r.get("service")
            svc = f"{s['p50_ms']:.1f} / {s['p99_ms']:.1f}" if s else "in-process (sync)"
            lines.append(f"| {name} | {b} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} | {svc} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 4), squeeze=False)
    for ax, (name, by_b) in zip(axes[0], results.items()):
        sizes = list(by_b)
        x = np.arange(len(sizes))
        ax.bar(x - 0.2, [by_b[b]["alone"]["p50_ms"] for b in sizes], 0.4, label="alone")
        if "service" in by_b[sizes[0]]:
            ax.bar(x + 0.2, [by_b[b]["service"]["p50_ms"] for b in sizes], 0.4,
                   label="service")
        ax.set(xticks=x, xticklabels=[str(b) for b in sizes], xlabel="batch",
               ylabel="p50 ms per request", title=name, yscale="log")
        ax.legend(fontsize=8)
    fig.suptitle("predictor latency per request on this CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
