"""A vLLM scheduler with no model executor, for tests and the scheduler benchmark.

Mirrors vLLM's own ``tests/v1/core/utils.py`` (not shipped in the wheel): a real
``VllmConfig`` on a config-only model folder, one full-attention KV cache group, and
``ModelRunnerOutput``s made up by the caller. Every ``schedule()`` / ``update_from_output``
runs vLLM's real code.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from functools import cache, lru_cache
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    KVEventsConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK_SIZE = 16
EOS_TOKEN_ID = 2
MAX_POSITIONS = 1 << 20
"""``max_position_embeddings`` of the config-only model: any ``max_model_len`` up to it."""


@cache
def block_hasher(block_size: int = BLOCK_SIZE) -> Callable[[Request], list[Any]]:
    """The engine's request block hasher (as EngineCore sets it up), for prefix caching."""
    hash_fn = get_hash_fn_by_name(CacheConfig().prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)


@lru_cache(maxsize=1)
def config_only_model_dir() -> str:
    """A folder with just a tiny Llama ``config.json`` (no weights, no tokenizer)."""
    path = tempfile.mkdtemp(prefix="hetserve-sched-model-")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": MAX_POSITIONS,
        "torch_dtype": "float32", "eos_token_id": EOS_TOKEN_ID, "bos_token_id": 1,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def make_scheduler(
    cls: type[Scheduler] = Scheduler,
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    num_blocks: int = 10_000,
    policy: str = "fcfs",
    hetserve: dict[str, Any] | None = None,
    enable_prefix_caching: bool = True,
    block_size: int = BLOCK_SIZE,
    max_model_len: int = 8192,
    kv_cache_events: bool = False,
) -> Scheduler:
    """A scheduler of class ``cls`` with ``num_blocks`` KV blocks of ``block_size`` tokens.

    ``kv_cache_events``: the KV cache manager records vLLM's KV events (with vLLM's null
    publisher: the caller replaces ``scheduler.kv_event_publisher`` to receive them)."""
    model_config = ModelConfig(
        model=config_only_model_dir(), skip_tokenizer_init=True, dtype="float32",
        max_model_len=max_model_len, seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        policy=policy,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cache_config = CacheConfig(
        block_size=block_size, cache_dtype="auto", enable_prefix_caching=enable_prefix_caching,
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        kv_events_config=(KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                          if kv_cache_events else None),
        additional_config={"hetserve": hetserve or {}},
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=32,
                                  dtype=torch.float32),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=False,
    )


def make_request(
    request_id: str,
    *,
    prompt_len: int = 8,
    max_tokens: int = 4,
    priority: int = 0,
    arrival_time: float = 0.0,
    first_token: int = 10,
) -> Request:
    """A request whose prompt is ``prompt_len`` distinct-ish token ids."""
    tokens = [(first_token + i) % 1000 + 3 for i in range(prompt_len)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=block_hasher(),
    )


def fake_output(scheduler: Scheduler, scheduler_output: SchedulerOutput,
                token: int = 7) -> ModelRunnerOutput:
    """One sampled token for every scheduled request whose step reaches its last token;
    none for a partial prefill chunk (the model runner discards those samples)."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        request = scheduler.requests[rid]
        sampled.append([token] if request.num_computed_tokens >= request.num_tokens else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def step(scheduler: Scheduler) -> tuple[SchedulerOutput, list[str]]:
    """One engine step: schedule, fake model output, update. Returns ids that finished."""
    out = scheduler.schedule()
    engine_outputs = scheduler.update_from_output(out, fake_output(scheduler, out))
    finished: list[str] = []
    for eco in engine_outputs.values():
        for o in eco.outputs:
            if o.finish_reason is not None:
                finished.append(o.request_id)
    return out, finished


def add_all(scheduler: Scheduler, requests: Iterable[Request]) -> None:
    for r in requests:
        scheduler.add_request(r)
