"""``python -m kernels_bench profile --cluster FILE``: decode and prefill profile per engine.

For each engine entry of a cluster file (its first replica, started through the launcher
API with the file's own settings) on the real engine:

- decode: for every context length c and batch size b (1 .. max_num_seqs), b concurrent
  requests of c random prompt tokens generate ``--decode-tokens`` tokens each
  (``ignore_eos``); the engine's telemetry gives the step time of every interval between
  two snapshots in which the batch held exactly b requests and no prompt was waiting:
      step_ms = 1000 x (ts_b - ts_a) / (step_b - step_a)
  (one decode step = one output token per running request). The cell's value is the
  median (a cell is repeated, up to 3 times, until it has 5 samples); cells that need
  more KV cache than the engine has, b x (c + decode tokens) tokens, are skipped;
- prefill: single requests of c prompt tokens and one output token; the slope of the
  fastest of 5 latencies (contention only adds time) against c is
  ``prefill_ms_per_token``.

Outputs in ``--out``: ``<entry>.json`` (the curves), ``profiles.json`` (served model ->
``decode_ms_per_token``, ``max_batch_size`` and, with ``--trace``, ``mean_output_tokens``:
the file ``[router.predictors] profiles`` loads for Chimera's L[m] and LAAR's c(m)),
``telemetry.jsonl.gz`` (every snapshot: training data of RouteBalance's latency heads,
``python -m router.train tpot --data``) and ``profile.png``.

  decode_ms_per_token = step_ms at the largest batch <= max_batch_size, at the context
                        nearest ``--reference-context``
  max_batch_size      = min(max_num_seqs, KV capacity // (reference context + decode tokens))
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import zmq
from tqdm import tqdm

from engine_ext.telemetry import SchedulerSnapshot, snapshot_decoder, subscriber_binds
from kernels_bench.lib.cluster import ClusterError, BenchCluster
from kernels_bench.lib.engine_metrics import block_size, cache_config
from kernels_bench.lib.model_map import ModelMapError, parse_model_map, resolve_model_map
from kernels_bench.lib.priors import trace_priors
from launcher import LaunchError
from launcher.settings import LaunchConfig, load_launch_config
from router.config.cluster import ConfigError
from router.config.engines import EngineInstance
from router.predictors.artifact import library_versions
from router.trace_format import TraceFormatError, load_trace

TOKEN_RANGE = (100, 3000)
"""Random prompt token ids come from here (inside every built-in and real vocabulary)."""
PREFILL_REPEATS = 5
CELL_TRIES = 3
MIN_SAMPLES = 5
"""A decode cell is repeated (up to CELL_TRIES times) until it has this many samples."""
WINDOW_WAIT_S = 5.0
"""How long to wait for the telemetry of a finished cell to arrive."""
PROFILE_KEY_FILE = "cache_key"
"""Written into the profile's folder once it has completed: what it was measured on
(``python -m kernels_bench artifacts --profile`` keeps a profile whose key still holds)."""


@dataclass(frozen=True)
class Cell:
    batch_size: int
    context_tokens: int
    step_ms: float
    step_ms_p10: float
    step_ms_p90: float
    samples: int

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * 1000.0 / self.step_ms


def step_ms(a: SchedulerSnapshot, b: SchedulerSnapshot) -> float:
    """1000 x (ts_b - ts_a) / (step_b - step_a)."""
    return 1000.0 * (b.ts - a.ts) / (b.step - a.step)


def decode_samples(snaps: list[SchedulerSnapshot], batch: int) -> list[float]:
    """Step times between consecutive snapshots (no frame lost) that both show exactly
    ``batch`` running requests, none waiting and no prompt tokens left to compute."""
    def pure(s: SchedulerSnapshot) -> bool:
        return (not s.heartbeat and s.batch_size == batch and s.num_waiting == 0
                and s.queued_prefill_tokens == 0)

    return [step_ms(a, b) for a, b in zip(snaps, snaps[1:])
            if pure(a) and pure(b) and b.seq == a.seq + 1 and b.step > a.step]


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares y = intercept + slope x; returns (slope, intercept)."""
    slope, intercept = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(slope), float(intercept)


def profile_numbers(cells: list[Cell], max_num_seqs: int, kv_tokens: int, ref_context: int,
                    decode_tokens: int) -> tuple[float, int, int]:
    """(decode_ms_per_token, max_batch_size, context used) per the module docstring."""
    max_batch = max(1, min(max_num_seqs, kv_tokens // (ref_context + decode_tokens)))
    contexts = sorted({c.context_tokens for c in cells})
    ctx = min(contexts, key=lambda c: (abs(c - ref_context), c))
    at = [c for c in cells if c.context_tokens == ctx and c.batch_size <= max_batch]
    if not at:
        raise ValueError(f"no decode cell at context {ctx} with batch <= {max_batch}")
    return max(at, key=lambda c: c.batch_size).step_ms, max_batch, ctx


class TelemetryTap:
    """Collects one engine's snapshots in a background thread."""

    def __init__(self, endpoint: str) -> None:
        self.snaps: list[SchedulerSnapshot] = []
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        (self._sock.bind if subscriber_binds(endpoint) else self._sock.connect)(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        decoder = snapshot_decoder()
        while not self._stop.is_set():
            if self._sock.poll(100):
                got = decoder.decode(self._sock.recv_multipart())
                if got is not None:
                    self.snaps.append(got[2])

    async def window(self, t0: float, t1: float) -> list[SchedulerSnapshot]:
        """Snapshots taken in [t0, t1], once one taken after t1 has arrived (the engine
        sends one when its batch empties, and heartbeats while idle)."""
        deadline = time.monotonic() + WINDOW_WAIT_S
        while (not self.snaps or self.snaps[-1].ts < t1) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return [s for s in list(self.snaps) if t0 <= s.ts <= t1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(linger=0)
        self._ctx.term()


def kv_capacity_tokens(client: httpx.Client, url: str) -> int:
    """The engine's KV cache size in tokens (vLLM's ``cache_config_info``)."""
    try:
        labels = cache_config(client, url)
    except RuntimeError as e:
        raise ClusterError(str(e)) from None
    if labels.get("kv_cache_size_tokens", "None") != "None":
        return int(labels["kv_cache_size_tokens"])
    blocks, size = labels.get("num_gpu_blocks", "None"), block_size(labels)
    if blocks.isdigit() and size:
        return int(blocks) * size
    raise ClusterError(f"{url}/metrics has no cache_config_info: cannot size the KV cache")


class Prompts:
    """Distinct random prompts (no prefix cache hits between requests)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, n: int) -> list[int]:
        return self.rng.integers(*TOKEN_RANGE, size=n).tolist()


async def _complete(http: httpx.AsyncClient, inst: EngineInstance, prompt: list[int],
                    max_tokens: int) -> None:
    r = await http.post(f"{inst.url}/v1/completions", json={
        "model": inst.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
        "ignore_eos": True, "temperature": 0.0})
    if r.status_code != 200:
        raise ClusterError(f"{inst.name}: HTTP {r.status_code} {r.text[:300]}")


async def measure_engine(inst: EngineInstance, tap: TelemetryTap, batches: list[int],
                         contexts: list[int], decode_tokens: int, kv_tokens: int,
                         prompts: Prompts, bar: tqdm) -> dict[str, Any]:
    """Decode cells and prefill points of one engine."""
    cells, skipped, prefill = [], [], []
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0)) as http:
        for ctx in contexts:
            times = []
            for _ in range(PREFILL_REPEATS):
                t0 = time.perf_counter()
                await _complete(http, inst, prompts(ctx), 1)
                times.append(1000.0 * (time.perf_counter() - t0))
            prefill.append({"context_tokens": ctx, "ms": min(times)})
            bar.update()
            for b in batches:
                bar.set_postfix(engine=inst.name, context=ctx, batch=b, refresh=False)
                if b * (ctx + decode_tokens) > kv_tokens:
                    skipped.append({"batch_size": b, "context_tokens": ctx,
                                    "reason": "exceeds the KV cache"})
                    bar.update()
                    continue
                samples: list[float] = []
                for _ in range(CELL_TRIES):  # requests that reach the engine late spoil one
                    t0 = time.time()
                    await asyncio.gather(*(_complete(http, inst, prompts(ctx), decode_tokens)
                                           for _ in range(b)))
                    samples += decode_samples(await tap.window(t0, time.time()), b)
                    if len(samples) >= MIN_SAMPLES:
                        break
                if samples:
                    q10, q50, q90 = np.percentile(samples, [10, 50, 90])
                    cells.append(Cell(b, ctx, float(q50), float(q10), float(q90),
                                      len(samples)))
                else:
                    skipped.append({"batch_size": b, "context_tokens": ctx,
                                    "reason": "no pure decode interval in the telemetry "
                                    "(raise --decode-tokens)"})
                bar.update()
    return {"cells": cells, "skipped": skipped, "prefill": prefill}


def default_batches(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... up to max_num_seqs, and max_num_seqs itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


def _targets(cfg: LaunchConfig, names: list[str]) -> list[str]:
    local = [e.name for e in cfg.engines if not e.remote]
    for n in names:
        if n not in local:
            raise ConfigError(cfg.source, "engines", f"--engines {n}: no local engine of that "
                              f"name (local engines: {', '.join(local)})")
    chosen = names or local
    for n in chosen:
        if cfg.engine(n).max_num_seqs is None:
            raise ConfigError(cfg.source, f"engines.{n}.max_num_seqs",
                              "not set; the profile sweeps batch sizes up to it")
    return chosen


@dataclass(frozen=True)
class ProfileOptions:
    """What a profile sweeps and where it writes it (the options of ``kernels_bench profile``)."""

    out: Path = Path("bench_results/profile")
    run_dir: Path | None = None
    """Engine logs and sockets (default ``<out>/cluster``)."""
    batch_sizes: list[int] | None = None
    """Default: 1, 2, 4, ... up to each engine's ``max_num_seqs``."""
    contexts: list[int] = field(default_factory=lambda: [128, 512, 2048])
    """Prompt lengths (capped by ``max_model_len``)."""
    decode_tokens: int = 128
    reference_context: int = 512
    seed: int = 0


ERRORS = (ConfigError, ModelMapError, TraceFormatError, ClusterError, LaunchError, ValueError,
          OSError)
"""What ``profile_cluster`` raises on a bad file or a failed engine."""


def profile_cluster(cluster: Path, engines: list[str], a: ProfileOptions,
                    trace: Path | None = None, model_map: list[str] | None = None) -> None:
    """Profile ``engines`` of the cluster file (default: every local one) into ``a.out``;
    ``trace`` fills ``mean_output_tokens`` (served models mapped by ``model_map``)."""
    cfg = load_launch_config(cluster)
    names = _targets(cfg, engines)
    means = None
    if trace is not None:
        t = load_trace(trace)
        served = list(dict.fromkeys(cfg.engine(n).served_model_name for n in names))
        mapping = resolve_model_map(served, parse_model_map(model_map or []), t.models)
        means = trace_priors(t.complete_runs(mapping.values()), mapping)["mean_output_tokens"]
    run(cfg, names, a, means)


def machine() -> dict[str, Any]:
    """What an engine profile's step times depend on besides the cluster file."""
    import torch

    try:
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        cpu = ""
    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else [])
    return {"system": platform.system(), "arch": platform.machine(),
            "cpu": cpu or platform.processor(), "cores": os.cpu_count(), "gpus": gpus,
            **library_versions(["vllm", "torch"])}


def profile_key(cluster: Path, where: dict[str, Any]) -> str:
    """sha256 over what a profile of ``cluster`` measures: its engines, launcher and
    placement settings (not its router table), on the machine ``where``; ConfigError (a
    ValueError) on a bad or missing file."""
    tables = {k: v for k, v in load_launch_config(cluster).to_dict().items() if k != "router"}
    what = {"cluster": tables, "machine": where}
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str)
                                      .encode()).hexdigest()


def run_profile(cluster: Path, engines: list[str], options: ProfileOptions,
                trace: Path | None = None, model_map: list[str] | None = None) -> None:
    """``profile_cluster`` with its folder's key file removed first (a profile cut short is
    never taken as complete) and, when it profiled every engine (``engines`` empty),
    written after it: the cluster file and machine as the profile began (``build_tpot``
    then keeps it, whatever sweep made it). Raises what ``profile_cluster`` raises."""
    key = profile_key(cluster, machine())
    key_file = options.out / PROFILE_KEY_FILE
    key_file.unlink(missing_ok=True)
    profile_cluster(cluster, engines, options, trace, model_map)
    if not engines:
        key_file.write_text(key, encoding="utf-8")


def run(cfg: LaunchConfig, names: list[str], a: ProfileOptions,
        means: dict[str, float] | None) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    cluster = BenchCluster(cfg, a.run_dir or a.out / "cluster", tqdm.write)
    results: dict[str, dict[str, Any]] = {}
    prompts = Prompts(a.seed)
    try:
        cluster.prepare([cfg.engine(n) for n in names])
        targets = [i for i in cluster.instances() if i.replica == 0]
        plan = {}
        for inst in targets:
            e = cfg.engine(inst.engine)
            limit = (e.max_model_len or 10**9) - a.decode_tokens - 1
            contexts = sorted({min(c, limit) for c in a.contexts})
            assert e.max_num_seqs is not None
            plan[inst.name] = (contexts, a.batch_sizes or default_batches(e.max_num_seqs))
        total = sum(len(c) * (1 + len(b)) for c, b in plan.values())
        with gzip.open(a.out / "telemetry.jsonl.gz", "wb") as log, \
                tqdm(total=total, desc="profile", unit="cell") as bar:
            for inst in targets:
                contexts, batches = plan[inst.name]
                tap = TelemetryTap(inst.telemetry_endpoint)
                try:
                    kv = kv_capacity_tokens(cluster.http, inst.url)
                    got = asyncio.run(measure_engine(inst, tap, batches, contexts,
                                                     a.decode_tokens, kv, prompts, bar))
                finally:
                    tap.close()
                for s in tap.snaps:
                    log.write(msgspec.json.encode(s) + b"\n")
                results[inst.engine] = summarize(cfg, inst, got, kv, a, means)
                cluster.check_engines()
    finally:
        cluster.close()
    write_outputs(a.out, results)


def summarize(cfg: LaunchConfig, inst: EngineInstance, got: dict[str, Any], kv: int,
              a: ProfileOptions, means: dict[str, float] | None) -> dict[str, Any]:
    e = cfg.engine(inst.engine)
    assert e.max_num_seqs is not None
    cells: list[Cell] = got["cells"]
    ms, max_batch, ctx = profile_numbers(cells, e.max_num_seqs, kv, a.reference_context,
                                         a.decode_tokens)
    pre = got["prefill"]
    slope, intercept = (fit_line([q["context_tokens"] for q in pre], [q["ms"] for q in pre])
                        if len(pre) > 1 else (pre[0]["ms"] / pre[0]["context_tokens"], 0.0))
    out: dict[str, Any] = {
        "engine": inst.name, "entry": e.name, "model": e.model,
        "served_model_name": e.served_model_name,
        "decode_ms_per_token": ms, "max_batch_size": max_batch,
        "reference_context": ctx, "decode_tokens": a.decode_tokens,
        "prefill_ms_per_token": slope, "prefill_fixed_ms": intercept,
        "kv_capacity_tokens": kv, "max_num_seqs": e.max_num_seqs,
        "decode_curve": [{**asdict(c), "tokens_per_s": c.tokens_per_s} for c in cells],
        "skipped": got["skipped"], "prefill_curve": pre,
        "machine": {"platform": platform.platform(),
                    "processor": platform.processor() or platform.machine()},
    }
    if means is not None:
        out["mean_output_tokens"] = means[e.served_model_name]
    return out


def write_outputs(out: Path, results: dict[str, dict[str, Any]]) -> None:
    profiles: dict[str, dict[str, Any]] = {}
    for entry, r in results.items():
        (out / f"{entry}.json").write_text(json.dumps(r, indent=2) + "\n")
        keep: dict[str, Any] = {k: r[k] for k in ("decode_ms_per_token", "max_batch_size",
                                                  "mean_output_tokens") if k in r}
        profiles.setdefault(r["served_model_name"], keep)
    (out / "profiles.json").write_text(json.dumps(profiles, indent=2) + "\n")
    plot(out / "profile.png", results)
    print(f"\n{'engine':14} {'decode ms/tok':>13} {'max batch':>9} {'prefill ms/tok':>14}")
    for r in results.values():
        print(f"{r['engine']:14} {r['decode_ms_per_token']:>13.2f} {r['max_batch_size']:>9} "
              f"{r['prefill_ms_per_token']:>14.3f}")
    print(f"\n{'engine':14} {'context':>7} {'batch':>5} {'step ms':>8} {'tok/s':>7} {'n':>4}")
    for r in results.values():
        for c in r["decode_curve"]:
            print(f"{r['engine']:14} {c['context_tokens']:>7} {c['batch_size']:>5} "
                  f"{c['step_ms']:>8.2f} {c['tokens_per_s']:>7.0f} {c['samples']:>4}")
    print(f"\nwrote {out}: one JSON per engine, profiles.json (set [router.predictors] "
          "profiles to it), telemetry.jsonl.gz, profile.png")


def plot(path: Path, results: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in results.values():
        for ctx in sorted({c["context_tokens"] for c in r["decode_curve"]}):
            pts = sorted((c for c in r["decode_curve"] if c["context_tokens"] == ctx),
                         key=lambda c: c["batch_size"])
            label = f"{r['engine']}, ctx {ctx}"
            axes[0].plot([c["batch_size"] for c in pts], [c["step_ms"] for c in pts], "o-",
                         label=label)
            axes[1].plot([c["batch_size"] for c in pts], [c["tokens_per_s"] for c in pts],
                         "o-", label=label)
        pre = r["prefill_curve"]
        xs = [q["context_tokens"] for q in pre]
        (line,) = axes[2].plot(xs, [q["ms"] for q in pre], "o", label=r["engine"])
        axes[2].plot(xs, [r["prefill_fixed_ms"] + r["prefill_ms_per_token"] * x for x in xs],
                     "-", color=line.get_color())
    for ax, (x, y) in zip(axes, (("batch size", "decode step (ms)"),
                                 ("batch size", "decode tokens/s"),
                                 ("prompt tokens", "prefill latency (ms)"))):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Engine profile: decode step time vs batch and context, prefill time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
