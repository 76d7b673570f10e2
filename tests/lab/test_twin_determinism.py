"""The twin is a function of its inputs: same seeds, same records, in and across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from kernels_bench.lab.twin.engine_spec import engine_specs
from router.config.cluster import load_cluster_config
from tests.lab.twin_helpers import REPLAY_TOML, replay_records

ROOT = Path(__file__).resolve().parents[2]


def test_same_seed_same_records_different_jitter_seed_different_times() -> None:
    first = replay_records(seed=7, jitter_seed=1)
    assert len(first) == 60 and all(r[-2] is not None for r in first)  # every one finished
    assert replay_records(seed=7, jitter_seed=1) == first
    assert replay_records(seed=7, jitter_seed=2) != first


def test_same_records_in_another_process_with_another_hash_seed() -> None:
    """Seeds run in parallel processes: string hashing (set and dict order of request
    ids) must not change a run. (PYTHONHASHSEED also moves vLLM's block hashes, not the
    schedule.)"""
    code = ("import json; from tests.lab.twin_helpers import replay_records; "
            "print(json.dumps(replay_records(seed=7, jitter_seed=1)))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    there = [tuple(r) for r in json.loads(out.strip().splitlines()[-1])]
    assert there == replay_records(seed=7, jitter_seed=1)


def test_replay_cluster_is_sized_as_its_engines_are() -> None:
    """KV capacity as the engines logged it (vLLM 0.32 CPU, 128 MiB each): tiny-a
    131,072 tokens, tiny-b 21,760; vLLM's CPU block size and server batch defaults."""
    a, b = engine_specs(load_cluster_config(REPLAY_TOML))
    assert (a.name, a.num_blocks * a.block_size) == ("tiny-a-0", 131_072)
    assert (b.name, b.num_blocks * b.block_size) == ("tiny-b-0", 21_760)
    assert (a.block_size, a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len,
            a.sched_policy) == (128, 8, 2048, 4096, "stjf")
