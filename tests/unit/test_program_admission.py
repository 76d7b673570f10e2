"""Program-aware admission (scheduler_patches.program_admission) on vLLM's real scheduler,
KV cache manager and block pool, with no model (kernels_bench.lib.scheduler_harness).

Pools are tiny (blocks of 16 tokens) so that a new call admitted ahead of a returning one
must evict the returning program's protected prefix.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from engine_ext.schedulers import STJFAsyncScheduler, STJFScheduler  # noqa: E402
from engine_ext.serve import build_parser, vllm_argv  # noqa: E402
from kernels_bench.lib.scheduler_harness import block_hasher, make_scheduler, step  # noqa: E402
from scheduler_patches.contract import RetentionHint  # noqa: E402
from scheduler_patches.program_admission import (  # noqa: E402
    AdmissionSettings,
    kv_pressure,
)
from scheduler_patches.settings import from_table  # noqa: E402

BLOCK = 16
ON = {"admit_returning_first": True}


def tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids of a text of its own (``seed``)."""
    return [(seed * 7919 + i * 31) % 997 + 3 for i in range(n)]


def request(rid: str, prompt: list[int], hint: RetentionHint | None = None,
            priority: int = 100, max_tokens: int = 1, arrival_time: float = 0.0) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                            extra_args=hint.xargs() if hint else None)
    return Request(request_id=rid, prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, arrival_time=arrival_time, priority=priority,
                   block_hasher=block_hasher())


def scheduler(cls: type[Scheduler] = STJFScheduler, num_blocks: int = 11,
              max_num_seqs: int = 8, **settings: Any) -> Scheduler:
    """``num_blocks`` blocks (one is vLLM's null block); retention's clock fixed."""
    s = make_scheduler(cls, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                       hetserve=settings)
    s.retention.clock = lambda: 1000.0
    return s


def finish(s: Scheduler, max_steps: int = 200) -> dict[str, tuple[int, int]]:
    """Step until idle; per request first scheduled: (step, prompt tokens it found cached)."""
    seen: dict[str, tuple[int, int]] = {}
    for n in range(max_steps):
        if not s.has_requests():
            return seen
        out, _ = step(s)
        for new in out.scheduled_new_reqs:
            seen[new.req_id] = (n, new.num_computed_tokens)
    raise AssertionError("the engine did not finish")


def assert_all_free(s: Scheduler) -> None:
    s.retention.release_all("test")
    pool = s.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert all(b.ref_cnt == 0 for b in pool.blocks if not b.is_null)


A = tokens(1, 4 * BLOCK)  # program a's first call: 4 full blocks
A2 = A + [5] + tokens(9, 2 * BLOCK)  # its return: 97 tokens, 7 blocks, 4 of them cached
NEW = tokens(2, 10 * BLOCK)  # a new program's call: the whole pool of 10 blocks


def returning_vs_new(cls: type[Scheduler], **settings: Any) -> dict[str, tuple[int, int]]:
    """a's blocks protected (6 of 10 free); then a new call with a better STJF key than
    a's return, which alone needs every block of the pool, and a's return, at once."""
    s = scheduler(cls, **settings)
    s.add_request(request("a1", A, RetentionHint("a", expected_return_s=2.0)))
    finish(s)
    assert "a" in s.retention and s.kv_cache_manager.block_pool.get_num_free_blocks() == 6
    s.add_request(request("new", NEW, priority=10))
    s.add_request(request("a2", A2, RetentionHint("a", final=True), priority=100))
    seen = finish(s)
    assert sum(s.retention.released.values()) == 1  # a's protection, once
    assert_all_free(s)
    return seen


# ---------------------------------------------------------------- the preference


@pytest.mark.parametrize("cls", [STJFScheduler, STJFAsyncScheduler])
def test_under_pressure_a_returning_program_is_admitted_ahead_and_hits_its_blocks(cls) -> None:
    off = returning_vs_new(cls)  # STJF alone: the new call first, evicting a's blocks
    assert off["new"][0] < off["a2"][0] and off["a2"][1] == 0
    on = returning_vs_new(cls, **ON)  # a resumes on its 4 protected blocks, then the new one
    assert on["a2"] == (0, 4 * BLOCK) and on["new"][0] == 1 and on["new"][1] == 0


def test_counts_the_calls_it_admitted_first() -> None:
    s = scheduler(**ON)
    s.add_request(request("a1", A, RetentionHint("a", expected_return_s=2.0)))
    finish(s)
    s.add_request(request("new", NEW, priority=10))
    s.add_request(request("a2", A2, RetentionHint("a", final=True)))
    finish(s)
    assert s.admitted_first == 1


def test_without_pressure_the_order_is_stjfs() -> None:
    """A pool that holds everything: both calls in one step, in STJF's order."""
    orders = []
    for settings in ({}, ON):
        s = scheduler(num_blocks=41, **settings)
        s.add_request(request("a1", A, RetentionHint("a", expected_return_s=2.0)))
        finish(s)
        s.add_request(request("new", NEW, priority=10))
        s.add_request(request("a2", A2, RetentionHint("a", final=True)))
        out, _ = step(s)
        orders.append([r.req_id for r in out.scheduled_new_reqs])
        assert s.admit_first == set()
    assert orders[0] == orders[1] == ["new", "a2"]


def test_steps_are_identical_on_and_off_when_the_pool_holds_everything() -> None:
    """A random mix of returning programs on a pool never under pressure: every step
    schedules the same requests, the same tokens, with the setting on and off."""
    runs = []
    for settings in ({}, ON):
        rng = random.Random(7)
        s = scheduler(num_blocks=2001, max_protected_fraction=1.0, **settings)
        prompts = {f"p{i}": tokens(100 + i, rng.randrange(8, 40)) for i in range(6)}
        trace = []
        for n in range(60):
            program = rng.choice(sorted(prompts))
            prompts[program] += tokens(200 + n, rng.randrange(1, 30))
            s.add_request(request(f"r{n}", list(prompts[program]), RetentionHint(program),
                                  priority=rng.randrange(1, 50), max_tokens=rng.randrange(1, 9),
                                  arrival_time=float(n)))
            for _ in range(rng.randrange(0, 3)):
                out, _ = step(s)
                trace.append(sorted(out.num_scheduled_tokens.items()))
        while s.has_requests():
            out, _ = step(s)
            trace.append(sorted(out.num_scheduled_tokens.items()))
        assert s.admitted_first == 0
        runs.append(trace)
    assert runs[0] == runs[1]


# ---------------------------------------------------------------- aging bounds the wait


@pytest.mark.parametrize("threshold", [1, 2, 4])
def test_aging_bounds_the_wait_of_a_new_call_behind_returning_ones(threshold: int) -> None:
    """One call at a time; a new call with the best priority, needing protected blocks,
    and a returning program every step, each sorted ahead of it at level 0: after S
    pass-overs the new call is promoted and admitted first, the returning ones after it."""
    programs = threshold + 4
    s = scheduler(num_blocks=61, max_num_seqs=1, max_protected_fraction=1.0,
                  starvation_threshold=threshold, quantum=4, **ON)
    prefix = {f"p{i}": tokens(300 + i, 2 * BLOCK) for i in range(programs)}
    for program, prompt in prefix.items():
        s.add_request(request(f"{program}-1", prompt, RetentionHint(program, expected_return_s=5)))
    finish(s)
    assert len(s.retention) == programs  # 2 blocks each, protected
    s.add_request(request("new", tokens(2, 40 * BLOCK), priority=1))
    for n, program in enumerate(prefix):
        # a returning call: its 2 protected blocks and 34 new ones, the worst priority
        s.add_request(request(f"{program}-2", prefix[program] + tokens(400 + n, 34 * BLOCK),
                              RetentionHint(program, final=True), priority=10**6))
        out, _ = step(s)
        if [r.req_id for r in out.scheduled_new_reqs] == ["new"]:
            break
    assert n == threshold and s.admitted_first == threshold  # passed over S times, then first
    seen = finish(s)
    assert seen[f"p{n}-2"][1] == 2 * BLOCK  # the one behind it still resumes on its blocks
    assert_all_free(s)


# ---------------------------------------------------------------- no refusal, no deadlock


def test_a_random_mix_on_a_tight_pool_always_finishes_with_references_adding_up() -> None:
    rng = random.Random(3)
    s = scheduler(num_blocks=41, max_protected_programs=6, max_protected_fraction=0.8,
                  starvation_threshold=3, quantum=2, **ON)
    pool = s.kv_cache_manager.block_pool
    prompts = {f"p{i}": tokens(100 + i, rng.randrange(8, 60)) for i in range(8)}
    for n in range(120):
        program = rng.choice(sorted(prompts))
        final = rng.random() < 0.15
        prompts[program] += tokens(200 + n, rng.randrange(1, 40))
        if len(prompts[program]) > 30 * BLOCK:
            prompts[program] = prompts[program][:20 * BLOCK]
        s.add_request(request(f"r{n}", list(prompts[program]), RetentionHint(
            program, final, rng.choice([None, 0.5, 2.0])), priority=rng.randrange(1, 1000),
            max_tokens=rng.randrange(1, 24), arrival_time=float(n)))
        if final:
            prompts[program] = tokens(300 + n, rng.randrange(8, 60))
        for _ in range(rng.randrange(0, 3)):
            step(s)
            refs = Counter(id(b) for rid in s.requests
                           for group in s.kv_cache_manager.get_blocks(rid).blocks
                           for b in group if not b.is_null)
            refs.update(id(b) for p in s.retention.programs.values() for b in p.blocks)
            assert all(b.ref_cnt == refs[id(b)] for b in pool.blocks if not b.is_null)
    finish(s, max_steps=2000)
    assert s.admitted_first > 0  # the preference acted
    assert all(r == 0 for r in (len(s.waiting), len(s.running)))
    assert_all_free(s)


# ---------------------------------------------------------------- settings


def test_pressure_counts_the_waiting_tokens_in_blocks_without_hits() -> None:
    assert not kv_pressure(free_blocks=3, pending_tokens=32, num_waiting=1, block_size=16)
    assert kv_pressure(free_blocks=3, pending_tokens=33, num_waiting=1, block_size=16)
    assert not kv_pressure(free_blocks=0, pending_tokens=0, num_waiting=0, block_size=16)


def test_off_by_default_keys_and_flags() -> None:
    assert from_table(AdmissionSettings, {"engine_id": "e"}) == AdmissionSettings()
    assert not AdmissionSettings().admit_returning_first
    with pytest.raises(ValueError, match="admit_returning_first"):
        from_table(AdmissionSettings, {"admit_returning_first": "yes"})
    s = scheduler()
    s.add_request(request("x", tokens(1, 8), priority=7))
    assert s.waiting._key_fn(s.requests["x"]) == s.aging.entries["x"].key()  # STJF's key
    ns, rest = build_parser().parse_known_args(["--model", "/m", "--admit-returning-first"])
    argv = vllm_argv(ns, rest)
    assert json.loads(argv[argv.index("--additional-config") + 1])["hetserve"][
        "admit_returning_first"] is True
    ns, rest = build_parser().parse_known_args(["--model", "/m", "--sched-policy", "fcfs",
                                                "--admit-returning-first"])
    with pytest.raises(ValueError, match="stjf"):
        vllm_argv(ns, rest)
