"""What an engine twin is sized by: one engine instance of a cluster file, as vLLM sizes it.

The KV capacity is vLLM's for a model with only full-attention layers (``FullAttentionSpec``
page size x layers): ``num_blocks = kv_cache_bytes // (block_size x bytes per token)``,
``bytes per token = 2 (K and V) x layers x KV heads x head size x dtype bytes``, with the
model's shape from its ``config.json``. It matches the engines' own logs here
(``builtin:tiny-a``, 128 MiB: 131,072 tokens; ``builtin:tiny-b``: 21,760).

An engine is hetserve's (``engine_ext.serve``: its policy's scheduler class, snapshots) or,
when the run asks for stock engines and its policy is one of vLLM's own
(``STOCK_SCHED_POLICIES``), a stock vLLM server (``EngineSpec.stock``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine_ext.serve import build_parser
from kernels_bench.lib.model_config import kv_bytes_per_token, model_config
from launcher.plan import default_kv_cache_bytes
from router.config.cluster import ClusterConfig
from router.config.engines import RETENTION_KEYS, STOCK_SCHED_POLICIES, LocalEngine

CPU_BLOCK_SIZE = 128
"""vLLM's block size on CPU when none is given (``vllm/platforms/cpu.py``; 16 on CUDA)."""
CPU_MAX_NUM_BATCHED_TOKENS = 2048
"""vLLM's OpenAI server default on CPU (``EngineArgs.get_batch_defaults``; chunked prefill)."""
CPU_MAX_NUM_SEQS = 128
"""vLLM's OpenAI server default on CPU."""
_SCHEDULER_KEYS = ("starvation_threshold", "quantum", "max_promotions", "mlfq_levels",
                   "mlfq_base_quantum", *RETENTION_KEYS)


@dataclass(frozen=True)
class EngineSpec:
    """One engine instance as its twin builds it."""

    name: str
    """The engine id (``<entry>-<replica>``), also its telemetry and KV-event topic."""
    entry: str
    served_model_name: str
    sched_policy: str
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    settings: dict[str, Any] = field(default_factory=dict)
    """The scheduler's settings (aging S and Q, MLFQ levels, KV retention), as
    ``engine_ext.serve`` passes them in the ``hetserve`` table."""
    stock: bool = False
    """A stock vLLM server: vLLM's own ``Scheduler`` with its ``--scheduling-policy``
    (``sched_policy``, one of ``STOCK_SCHED_POLICIES``), vLLM's KV events and no snapshots (the
    router scrapes its ``/metrics``); False: hetserve's engine."""


def _block_size(extra_args: list[str]) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--block-size", type=int, default=CPU_BLOCK_SIZE)
    return p.parse_known_args(extra_args)[0].block_size


def engine_specs(cfg: ClusterConfig, stock: bool = False) -> list[EngineSpec]:
    """One spec per local engine instance of a cluster file, in file order; an engine of
    ``kind = "vllm"`` is a stock vLLM server, and with ``stock`` so is every engine whose
    policy is one of ``STOCK_SCHED_POLICIES``."""
    base_dir = Path(cfg.source).parent
    default_policy = build_parser().get_default("sched_policy")
    out = []
    for e in cfg.engines:
        if not isinstance(e, LocalEngine) or e.model is None:
            raise ValueError(f"engines.{e.name}: a remote engine has no model to twin")
        out += [_spec(e, i, base_dir, default_policy) for i in range(e.replicas)]
    return [replace(s, stock=True) if stock and s.sched_policy in STOCK_SCHED_POLICIES else s
            for s in out]


def _spec(e: LocalEngine, replica: int, base_dir: Path, default_policy: str) -> EngineSpec:
    assert e.model is not None
    config = model_config(e.model, base_dir)
    block_size = _block_size(e.extra_args)
    kv_bytes = e.kv_cache_bytes or default_kv_cache_bytes(e.model)
    num_blocks = kv_bytes // (block_size * kv_bytes_per_token(config, e.dtype))
    max_model_len = e.max_model_len or int(config["max_position_embeddings"])
    max_num_seqs = e.max_num_seqs or CPU_MAX_NUM_SEQS
    batched = e.max_num_batched_tokens or min(CPU_MAX_NUM_BATCHED_TOKENS,
                                              max_num_seqs * max_model_len)
    return EngineSpec(
        name=f"{e.name}-{replica}", entry=e.name, served_model_name=e.served_model_name,
        sched_policy=e.sched_policy or ("fcfs" if e.kind == "vllm" else default_policy),
        stock=e.kind == "vllm",
        max_num_seqs=min(max_num_seqs, batched) if e.max_num_seqs is None else max_num_seqs,
        max_num_batched_tokens=batched, max_model_len=max_model_len,
        block_size=block_size, num_blocks=num_blocks,
        settings={k: getattr(e, k) for k in _SCHEDULER_KEYS if getattr(e, k) is not None},
    )
