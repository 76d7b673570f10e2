"""``python -m kernels_bench router``: routing decision latency per policy.

For each cluster size (default 2, 16, 64 engines, half serving a small and half a large
model) it builds one ``RouterCore`` per policy over the same synthetic state: every
engine has a scheduler snapshot (fed through the telemetry decoder) and a prefix cache
holding some of a pool of shared 512-token system prompts (fed as KV events). Requests
carry ~700-token prompts (one shared prefix plus a unique suffix, so KV-aware policies
hash five blocks) and workflow metadata.

A batch of N requests is a burst of N concurrent ``route()`` calls on one event loop;
routebalance collects them into one batch (``max_batch = N``), the others decide them one
after the other. A request's latency runs from the burst's arrival to its decision, so
it includes waiting for the decisions before it (or for its batch). The CPU time per
request (burst CPU time / N) is recorded too. Decisions are released after each burst,
so the state stays the same. Policies run in interleaved rounds (noise from other
processes hits all alike) and the table shows p50 and p99 per request and the ratio of
p50s against ``round_robin`` from the same run. Predictor-backed policies use static
priors, unless ``--artifacts DIR`` names trained predictors (``DIR/semantic_router``,
``DIR/length``, ``DIR/knn``, as ``make artifacts`` writes each fold): then the engines
serve the artifacts' two models, requests carry the first-stage prompts of ``--data``
traces, and the predictors run where the router would run them (``ServiceSettings``:
in-process when a call costs at most ``inline_max_ms``, else behind the batched pool),
so a decision includes prediction. JSON and a PNG plot go to ``--out``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

from engine_ext.telemetry import (BlockStored, KVEvent, KVEventBatch, SchedulerSnapshot,
                                  encode_snapshot)
from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import RemoteEngine
from router.dispatch.core import RouterCore
from router.predictors.artifact import read_metadata
from router.predictors.base import PredictorSet
from router.predictors.loader import load_predictors
from router.predictors.records import StageRecord
from router.predictors.service import Served, ServiceSettings
from router.predictors.sources import load_records
from router.state.kv_hash import BlockHasher
from router.request import Workflow
from router.types import RoutingRequest

ENGINES = (2, 16, 64)
BATCHES = (1, 4, 16, 64)
BLOCK = 128
MODELS = ("small", "large")
PREFIXES = 8
PREFIX_TOKENS = 512
STATIC: dict[str, dict[str, Any]] = {
    "chimera": {"static_prior": True, "confidence": {"small": 0.6, "large": 0.8},
                "mean_output_tokens": {"small": 200, "large": 300},
                "decode_ms_per_token": {"small": 5.0, "large": 15.0},
                "max_batch_size": {"small": 64, "large": 32}},
    "routebalance": {"static_prior": True, "quality": {"small": 0.6, "large": 0.8},
                     "mean_output_tokens": {"small": 200, "large": 300},
                     "decode_ms_per_token": {"small": 5.0, "large": 15.0},
                     "cost_per_token": {"small": 1e-7, "large": 4e-7}},
    "laar": {"static_prior": True, "capability": {"small": 0.6, "large": 0.8},
             "mean_output_tokens": {"small": 200, "large": 300},
             "decode_ms_per_token": {"small": 5.0, "large": 15.0}},
    "random_mix": {"big_model": "large", "share": 0.3},
    "online": {"mean_output_tokens": {"small": 200, "large": 300},
               "decode_ms_per_token": {"small": 5.0, "large": 15.0},
               "max_batch_size": {"small": 64, "large": 32}},
    # the bench's requests carry no VineLM objective: this measures its fallback path
    "vinelm": {"static_prior": True, "fallback": "lmetric",
               "workflows": {"bench": {"stages": [{"name": "solve", "models": list(MODELS),
                                                   "answers": True}]}},
               "success": {"small": 0.6, "large": 0.8}, "cost_per_call": {"small": 1.0,
                                                                         "large": 4.0},
               "latency_s_per_call": {"small": 1.0, "large": 3.0},
               "decode_ms_per_token": {"small": 5.0, "large": 15.0},
               "max_batch_size": {"small": 64, "large": 32}},
}


TRACES = ("data/traces/math.jsonl.gz", "data/traces/code.jsonl.gz")
LEARNED = ("semantic_router", "length", "knn")
"""The trained predictors ``--artifacts`` loads (those present)."""


@dataclasses.dataclass
class Cluster:
    instances: list[SimpleNamespace]
    snapshot_frames: list[list[bytes]]
    kv_frames: list[list[bytes]]
    prefixes: list[list[int]]
    models: tuple[str, str] = MODELS
    """Small, large served model."""
    predictors: PredictorSet | None = None
    prompts: list[StageRecord] = dataclasses.field(default_factory=list)
    """First stages of trace runs whose texts the requests carry (with predictors)."""


def renamed(value: Any, models: tuple[str, str]) -> Any:
    """``value`` with the bench's model names replaced by ``models`` (keys, items and
    values)."""
    names = dict(zip(MODELS, models))
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, dict):
        return {names.get(k, k): renamed(v, models) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, models) for v in value]
    return value


def learned(artifacts: Path, data: list[str]) -> tuple[PredictorSet, tuple[str, str],
                                                       list[StageRecord]]:
    """The trained predictors in ``artifacts`` (placed as the router places them), their
    two served models (small first, as ``sorted`` names them: the replay's tiny-a, tiny-b)
    and the first stages of ``data``."""
    paths = {n: str(artifacts / n) for n in LEARNED if (artifacts / n).is_dir()}
    if "semantic_router" not in paths:
        raise SystemExit(f"--artifacts {artifacts}: no semantic_router folder (make artifacts "
                         "writes artifacts/fold-K/semantic_router)")
    models = sorted(read_metadata(paths["semantic_router"], "semantic_router").models)
    if len(models) != 2:
        raise SystemExit(f"--artifacts {artifacts}: expected two served models, got {models}")
    pset = load_predictors(paths, models, service=ServiceSettings())
    for name, ms in sorted(pset.call_ms.items()):
        where = "worker pool" if isinstance(getattr(pset, name), Served) else "in-process"
        print(f"  {name}: {ms:.2f} ms per call at start-up -> {where}")
    prompts = [r for r in load_records(data) if r.stage_index == 0]
    return pset, (models[0], models[1]), prompts


def make_cluster(n: int, rng: random.Random, models: tuple[str, str] = MODELS) -> Cluster:
    hasher = BlockHasher()
    prefixes = [[rng.randrange(3, 4000) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    instances, snaps, kvs = [], [], []
    for i in range(n):
        name = f"e{i:03d}"
        instances.append(SimpleNamespace(
            name=name, served_model_name=models[i % 2], url=f"http://127.0.0.1:{9000 + i}",
            telemetry_endpoint=None, kv_events_endpoint=None, max_model_len=4096))
        snap = SchedulerSnapshot(
            engine_id=name, seq=0, ts=0.0, step=1, batch_size=rng.randrange(0, 32),
            num_waiting=rng.randrange(0, 8), queued_prefill_tokens=rng.randrange(0, 4000),
            pending_decode_tokens=rng.randrange(0, 8000), kv_usage=rng.random(),
            num_preemptions=0)
        snaps.append([name.encode(), (0).to_bytes(8, "big"), encode_snapshot(snap)])
        held = rng.sample(prefixes, k=max(1, PREFIXES // 4))
        events: list[KVEvent] = [
            BlockStored(block_hashes=list[int | bytes](hasher.block_hashes(p, BLOCK)),
                        parent_block_hash=None, token_ids=p, block_size=BLOCK) for p in held]
        kvs.append([name.encode(), (0).to_bytes(8, "big"),
                    msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=events))])
    return Cluster(instances, snaps, kvs, prefixes, models)


def make_core(policy: str, cluster: Cluster, batch: int) -> RouterCore:
    settings = renamed(dict(STATIC.get(policy, {})), cluster.models)
    if policy == "routebalance":
        settings["max_batch"] = batch
    engines = [RemoteEngine(name=i.name, served_model_name=i.served_model_name, url=i.url,
                            telemetry_endpoint=f"ipc:///nonexistent/{i.name}.telemetry",
                            kv_events_endpoint=f"ipc:///nonexistent/{i.name}.kv",
                            max_model_len=i.max_model_len) for i in cluster.instances]
    config = ClusterConfig(source="router_bench", engines=engines, router=RouterConfig(
        policy=policy, policies={policy: settings}, heartbeat_timeout_s=1e9))
    core = RouterCore(config, cluster.predictors)
    core.build_policy()
    for frames in cluster.snapshot_frames:
        core.membership.snapshots.feed(frames)
    for frames in cluster.kv_frames:
        core.membership.kv_events.feed(frames)
    return core


def make_requests(cluster: Cluster, count: int, rng: random.Random) -> list[RoutingRequest]:
    out = []
    for i in range(count):
        ids = rng.choice(cluster.prefixes) + [rng.randrange(3, 4000) for _ in range(190)]
        stages = rng.randrange(1, 5)
        meta = Workflow(program_id=f"p{rng.randrange(64)}", workflow="bench",
                        stage_index=rng.randrange(stages), num_stages=stages)
        texts: dict[str, str] = {"prompt_text": "", "user_text": ""}
        if cluster.prompts:  # a trace's first stage: its texts and workflow
            r = rng.choice(cluster.prompts)
            texts = {"prompt_text": r.prompt_text, "system_text": r.system_text,
                     "user_text": r.user_text}
            meta = Workflow(program_id=f"p{i}", workflow=r.workflow, stage=r.stage,
                            stage_index=0, num_stages=r.num_stages)
        out.append(RoutingRequest(request_id=f"q{i}", requested_model=None,
                                  prompt_token_ids=ids, num_prompt_tokens=len(ids),
                                  max_tokens=256, workflow=meta, **texts))
    return out


async def run_batch(core: RouterCore, reqs: list[RoutingRequest]) -> tuple[list[float], float]:
    """Route ``reqs`` as one burst: each request's latency from the burst's arrival to its
    decision (seconds), and the CPU seconds the burst cost; then release the decisions."""
    async def one(req: RoutingRequest) -> tuple[float, Any]:
        decision = await core.routing.route(req)
        return time.perf_counter() - t0, decision

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(r) for r in reqs))
    cpu = time.process_time() - cpu0
    for _, decision in results:
        core.routing.on_complete(decision, 100, None)
    return [lat for lat, _ in results], cpu


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclasses.dataclass
class Samples:
    latency_s: list[float] = dataclasses.field(default_factory=list)
    cpu_s: float = 0.0


async def measure(policies: list[str], engines: int, batch: int, requests: int,
                  seed: int, predictors: PredictorSet | None = None,
                  models: tuple[str, str] = MODELS, prompts: list[StageRecord] | None = None
                  ) -> dict[str, Samples]:
    rng = random.Random(seed + engines)
    cluster = make_cluster(engines, rng, models)
    cluster.predictors, cluster.prompts = predictors, prompts or []
    cores = {p: make_core(p, cluster, batch) for p in policies}
    pool = make_requests(cluster, 512, rng)
    rounds = max(20, requests // batch)
    samples = {p: Samples() for p in policies}
    serial = 0
    gc.collect()
    for rnd in range(rounds + 2):  # two warm-up rounds
        picks = [rng.choice(pool) for _ in range(batch)]
        for p in policies:
            reqs = [dataclasses.replace(r, request_id=f"{r.request_id}-{serial + k}")
                    for k, r in enumerate(picks)]
            serial += batch
            lat, cpu = await run_batch(cores[p], reqs)
            if rnd >= 2:
                samples[p].latency_s += lat
                samples[p].cpu_s += cpu
    return samples


def summarise(samples: dict[str, Samples], engines: int, batch: int) -> list[dict[str, Any]]:
    base = samples["round_robin"]
    base50, base99 = statistics.median(base.latency_s), percentile(base.latency_s, 0.99)
    rows = []
    for p, s in samples.items():
        p50, p99 = statistics.median(s.latency_s), percentile(s.latency_s, 0.99)
        rows.append({"policy": p, "engines": engines, "batch": batch, "n": len(s.latency_s),
                     "p50_us": p50 * 1e6, "p99_us": p99 * 1e6,
                     "mean_us": statistics.fmean(s.latency_s) * 1e6,
                     "cpu_us_per_request": s.cpu_s / len(s.latency_s) * 1e6,
                     "ratio_p50": p50 / base50, "ratio_p99": p99 / base99,
                     "ratio_cpu": s.cpu_s / base.cpu_s})
    return rows


def print_table(rows: list[dict[str, Any]], engines: int, batches: list[int]) -> None:
    by = {(r["policy"], r["batch"]): r for r in rows if r["engines"] == engines}
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    print(f"\n{engines} engines: decision latency per request, p50 / p99 us (x round_robin "
          f"p50) | CPU us per request (x round_robin)")
    head = f"{'policy':15}" + "".join(f"{f'batch {b}':>38}" for b in batches)
    print(head)
    print("-" * len(head))
    for p in policies:
        cells = [f"{r['p50_us']:7.0f} /{r['p99_us']:7.0f} (x{r['ratio_p50']:4.1f}) |"
                 f"{r['cpu_us_per_request']:5.0f} (x{r['ratio_cpu']:3.1f})"
                 for r in (by[(p, b)] for b in batches)]
        print(f"{p:15}" + "".join(f"{c:>38}" for c in cells))


def plot(rows: list[dict[str, Any]], engines: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(engines), figsize=(5 * len(engines), 4), sharey=True)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    cmap = plt.get_cmap("tab20")
    for ax, n in zip([axes] if len(engines) == 1 else axes, engines):
        for k, p in enumerate(policies):
            pts = sorted((r["batch"], r["p50_us"]) for r in rows
                         if r["engines"] == n and r["policy"] == p)
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="os^vD"[k % 5],
                    color=cmap((2 * k) % 20 + (k >= 10)), label=p)
        ax.set(title=f"{n} engines", xlabel="requests per batch", xscale="log", yscale="log")
        ax.grid(True, which="both", alpha=0.3)
    first = axes if len(engines) == 1 else axes[0]
    first.set_ylabel("p50 decision latency per request (us)")
    first.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
