"""KV retention between a program's calls (scheduler_patches.retention) on vLLM's real
scheduler, KV cache manager and block pool, with no model (kernels_bench.lib.scheduler_harness).

Pools are tiny (blocks of 16 tokens) so that a few requests evict each other's prefixes;
every test ends with every block back in vLLM's free queue once the protections go.
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
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from engine_ext.schedulers import (  # noqa: E402
    MLFQScheduler,
    STJFAsyncScheduler,
    STJFScheduler,
    VLLMScheduler,
)
from engine_ext.serve import build_parser, vllm_argv  # noqa: E402
from kernels_bench.lib.scheduler_harness import block_hasher, make_scheduler, step  # noqa: E402
from scheduler_patches.contract import RetentionHint  # noqa: E402
from scheduler_patches.protected import (  # noqa: E402
    ProtectedPrograms,
    RetentionSettings,
)
from scheduler_patches.settings import from_table  # noqa: E402

BLOCK = 16


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids of a text of its own (``seed``)."""
    return [(seed * 7919 + i * 31) % 997 + 3 for i in range(n)]


def request(rid: str, prompt: list[int], hint: RetentionHint | None = None,
            max_tokens: int = 1, extra: dict[str, Any] | None = None) -> Request:
    xargs = {**(hint.xargs() if hint else {}), **(extra or {})}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=xargs or None)
    return Request(request_id=rid, prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, arrival_time=0.0, block_hasher=block_hasher())


def scheduler(cls: type[Scheduler] = VLLMScheduler, num_blocks: int = 11,
              **settings: Any) -> tuple[Scheduler, Clock]:
    """``num_blocks`` blocks (one is vLLM's null block), retention on its own clock."""
    s = make_scheduler(cls, num_blocks=num_blocks, max_num_seqs=8, hetserve=settings)
    clock = Clock()
    if hasattr(s, "retention"):
        s.retention.clock = clock
    return s, clock


def run(s: Scheduler, r: Request, until: str | None = None, max_steps: int = 200) -> int:
    """Add ``r`` and step until request ``until`` (default: every request) has finished;
    the prompt tokens ``r`` found in the prefix cache when it was scheduled."""
    s.add_request(r)
    hit: int | None = None
    for _ in range(max_steps):
        if (until not in s.requests) if until else not s.has_requests():
            break
        out, _ = step(s)
        for new in out.scheduled_new_reqs:
            if new.req_id == r.request_id:
                hit = new.num_computed_tokens
    else:
        raise AssertionError("the engine did not finish")
    assert hit is not None
    return hit


def usable(s: Scheduler) -> int:
    return s.kv_cache_manager.block_pool.num_gpu_blocks - 1


def free(s: Scheduler) -> int:
    return s.kv_cache_manager.block_pool.get_num_free_blocks()


def assert_all_free(s: Scheduler) -> None:
    """Once nothing runs and nothing is protected, vLLM holds no block."""
    if hasattr(s, "retention"):
        s.retention.release_all("test")
    pool = s.kv_cache_manager.block_pool
    assert free(s) == usable(s)
    assert all(b.ref_cnt == 0 for b in pool.blocks if not b.is_null)


A = tokens(1, 4 * BLOCK)  # program a's first prompt: 4 full blocks
A2 = A + [5] + tokens(9, 2 * BLOCK)  # its next call: the first prompt, the output, a tool result


def pressure(s: Scheduler) -> None:
    """Another program's calls: 6 blocks, then 4, so LRU reaches a's blocks."""
    run(s, request("b", tokens(2, 6 * BLOCK)))
    run(s, request("c", tokens(3, 4 * BLOCK)))


# ---------------------------------------------------------------- protection vs vLLM's LRU


@pytest.mark.parametrize("cls", [VLLMScheduler, STJFScheduler, STJFAsyncScheduler,
                                 MLFQScheduler])
def test_protected_prefix_survives_pressure_that_evicts_it_without_the_patch(cls) -> None:
    stock, _ = scheduler(Scheduler)  # vLLM's own scheduler, same pool, same calls
    run(stock, request("a1", A, RetentionHint("a")))
    pressure(stock)
    assert run(stock, request("a2", A2, RetentionHint("a"))) == 0  # LRU evicted a

    s, _ = scheduler(cls)
    run(s, request("a1", A, RetentionHint("a", expected_return_s=2.0)))
    assert "a" in s.retention and s.retention.num_blocks == 4
    pressure(s)
    assert run(s, request("a2", A2, RetentionHint("a"))) == 4 * BLOCK
    assert s.retention.released["returned"] == 1
    assert_all_free(s)


def test_without_a_hint_the_patched_scheduler_is_vllms_lru() -> None:
    s, _ = scheduler()
    run(s, request("a1", A))
    pressure(s)
    assert run(s, request("a2", A2)) == 0 and len(s.retention) == 0


def test_a_returning_call_protects_its_longer_prefix_in_turn() -> None:
    s, clock = scheduler(num_blocks=21)
    run(s, request("a1", A, RetentionHint("a")))
    clock.t += 1
    run(s, request("a2", A2, RetentionHint("a")))
    # a2's 97 prompt tokens fill 6 blocks (a1's 4 among them) and start a 7th
    assert s.retention.num_blocks == 6 and s.retention.released["returned"] == 1
    run(s, request("b", tokens(2, 14 * BLOCK)))  # every other block of the pool
    assert run(s, request("a3", A2 + tokens(4, BLOCK), RetentionHint("a", final=True))) \
        == 6 * BLOCK
    assert len(s.retention) == 0 and s.retention.released["final"] == 1
    assert_all_free(s)


# ---------------------------------------------------------------- release rules


def test_expiry_releases_into_vllms_lru() -> None:
    s, clock = scheduler(retention_ttl_s=30, retention_slack=2)
    run(s, request("a1", A, RetentionHint("a", expected_return_s=1.0)))
    assert s.retention.programs["a"].deadline == pytest.approx(clock.t + 2.0)
    clock.t += 1.9
    step(s)
    assert "a" in s.retention
    clock.t += 0.2
    step(s)  # every schedule() expires first
    assert "a" not in s.retention and s.retention.released["expired"] == 1
    assert free(s) == usable(s)  # the blocks are back in vLLM's free queue...
    pressure(s)
    assert run(s, request("a2", A2, RetentionHint("a"))) == 0  # ...and LRU takes them


def test_ttl_caps_the_expected_return_and_applies_without_one() -> None:
    s, clock = scheduler(num_blocks=21, retention_ttl_s=5)
    run(s, request("a1", A, RetentionHint("a", expected_return_s=100.0)))
    run(s, request("b1", tokens(2, 2 * BLOCK), RetentionHint("b")))
    assert s.retention.programs["a"].deadline == pytest.approx(clock.t + 5)
    assert s.retention.programs["b"].deadline == pytest.approx(clock.t + 5)


def test_an_arrived_call_keeps_its_prefix_until_it_is_scheduled() -> None:
    s, clock = scheduler(retention_ttl_s=10)
    run(s, request("a1", A, RetentionHint("a", expected_return_s=1.0)))
    s.add_request(request("a2", A2, RetentionHint("a")))
    assert s.retention.programs["a"].next_use == clock.t  # released last from now on
    assert s.retention.programs["a"].deadline == pytest.approx(clock.t + 10)


def test_a_final_call_protects_nothing_and_aborted_calls_protect_nothing() -> None:
    s, _ = scheduler()
    run(s, request("a1", A, RetentionHint("a", final=True)))
    assert len(s.retention) == 0
    s.add_request(request("b1", tokens(2, 4 * BLOCK), RetentionHint("b"), max_tokens=50))
    step(s)
    s.finish_requests("b1", RequestStatus.FINISHED_ABORTED)
    assert len(s.retention) == 0 and not s.retention_hints
    assert_all_free(s)


def test_malformed_hints_are_ignored_and_counted() -> None:
    s, _ = scheduler()
    run(s, request("a1", A, extra={"hetserve_final": 0}))  # no program id
    assert len(s.retention) == 0 and s.malformed_hints == 1


# ---------------------------------------------------------------- bounds and the floor


def test_set_is_bounded_and_keeps_the_programs_expected_back_first() -> None:
    s, _ = scheduler(num_blocks=41, max_protected_programs=2)
    for i, back in enumerate([5.0, 1.0, 3.0, 10.0]):
        run(s, request(f"p{i}", tokens(10 + i, BLOCK),
                       RetentionHint(f"p{i}", expected_return_s=back)))
    assert set(s.retention.programs) == {"p1", "p2"}  # back in 1 s and 3 s
    assert s.retention.released["capacity"] == 1 and s.retention.refused == 1
    assert_all_free(s)


def test_protected_blocks_stay_within_their_share() -> None:
    s, _ = scheduler(num_blocks=21, max_protected_fraction=0.3)  # 6 of 20 blocks
    run(s, request("big", tokens(1, 7 * BLOCK), RetentionHint("big")))
    assert len(s.retention) == 0 and s.retention.refused == 1
    run(s, request("p", tokens(2, 4 * BLOCK), RetentionHint("p", expected_return_s=9.0)))
    run(s, request("q", tokens(3, 4 * BLOCK), RetentionHint("q", expected_return_s=1.0)))
    assert set(s.retention.programs) == {"q"} and s.retention.released["share"] == 1
    assert s.retention.num_blocks <= 6


def test_pressure_releases_rather_than_refuse_preempt_or_deadlock() -> None:
    # Everything protected: 5 programs x 2 blocks = the whole pool of 10.
    s, _ = scheduler(max_protected_fraction=1.0)
    for i, back in enumerate([3.0, 8.0, 1.0, 6.0, 2.0]):
        run(s, request(f"p{i}", tokens(20 + i, 2 * BLOCK),
                       RetentionHint(f"p{i}", expected_return_s=back)))
    assert free(s) == 0 and s.retention.num_blocks == usable(s)
    # A new call of 3 blocks plus decoding into a 4th and 5th: admitted at once, finished.
    x = request("x", tokens(40, 3 * BLOCK), max_tokens=2 * BLOCK)
    s.add_request(x)
    out, _ = step(s)
    assert "x" in out.num_scheduled_tokens
    while s.has_requests():
        step(s)
    assert x.num_preemptions == 0 and x.is_finished()
    # Released in Belady order: the programs expected back last (8 s, then 6 s, 3 s).
    assert set(s.retention.programs) == {"p2", "p4"}
    assert s.retention.released["pressure"] == 3
    assert_all_free(s)


def test_a_running_request_never_waits_for_protected_blocks() -> None:
    s, _ = scheduler(max_protected_fraction=1.0)
    long = request("long", tokens(50, BLOCK), max_tokens=4 * BLOCK)
    s.add_request(long)
    step(s)
    for i in range(4):  # 4 x 2 blocks protected while "long" decodes
        run(s, request(f"p{i}", tokens(60 + i, 2 * BLOCK), RetentionHint(f"p{i}")), f"p{i}")
    assert s.retention.num_blocks == 8 and not long.is_finished()
    while s.has_requests():
        step(s)
    assert long.is_finished() and long.num_preemptions == 0
    assert s.retention.released["pressure"] >= 1
    assert_all_free(s)


def test_reset_prefix_cache_releases_everything_first() -> None:
    s, _ = scheduler()
    run(s, request("a1", A, RetentionHint("a")))
    assert s.reset_prefix_cache() and len(s.retention) == 0
    assert_all_free(s)


def test_retention_off_keeps_vllms_allocator() -> None:
    s, _ = scheduler(max_protected_programs=0)
    run(s, request("a1", A, RetentionHint("a")))
    assert not s.retaining and len(s.retention) == 0
    assert "allocate_slots" not in vars(s.kv_cache_manager)


def test_block_references_add_up_under_a_random_mix_of_programs() -> None:
    """Every block's ref_cnt is the requests holding it plus the programs protecting it,
    after every step of 80 calls of 8 programs on a pool that cannot keep them all."""
    rng = random.Random(0)
    s, clock = scheduler(num_blocks=41, max_protected_programs=5, max_protected_fraction=0.8)
    prompts = {f"p{i}": tokens(100 + i, rng.randrange(8, 40)) for i in range(8)}
    pool = s.kv_cache_manager.block_pool
    for n in range(80):
        program = rng.choice(sorted(prompts))
        final = rng.random() < 0.15
        prompts[program] += tokens(200 + n, rng.randrange(1, 20))
        s.add_request(request(f"r{n}", list(prompts[program]), RetentionHint(
            program, final, rng.choice([None, 0.5, 2.0, 20.0])), max_tokens=rng.randrange(1, 20)))
        if final:
            prompts[program] = tokens(300 + n, rng.randrange(8, 40))
        for _ in range(rng.randrange(0, 4)):
            step(s)
            clock.t += rng.random()
            refs = Counter(id(b) for rid in s.requests
                           for group in s.kv_cache_manager.get_blocks(rid).blocks
                           for b in group if not b.is_null)
            refs.update(id(b) for p in s.retention.programs.values() for b in p.blocks)
            assert all(b.ref_cnt == refs[id(b)] for b in pool.blocks if not b.is_null)
            assert len(s.retention) <= 5 and s.retention.num_blocks <= 32
    while s.has_requests():
        step(s)
    assert set(s.retention.released) == {"returned", "final", "expired", "replaced",
                                         "pressure", "capacity"}  # every release rule ran
    assert_all_free(s)


# ---------------------------------------------------------------- the table and its settings


class CountingPool:
    def __init__(self) -> None:
        self.touched = self.freed = 0

    def touch(self, blocks: Any) -> None:
        self.touched += len(blocks)

    def free_blocks(self, blocks: Any) -> None:
        self.freed += len(list(blocks))


def test_heaps_stay_bounded_by_the_live_programs() -> None:
    table = ProtectedPrograms(RetentionSettings(), CountingPool(), 1000, clock=Clock())
    table.protect("p", [object()], 1.0)
    for _ in range(10_000):
        table.returned("p")
    assert len(table._expiry) <= 2 * len(table) + 65
    assert len(table._furthest) <= 2 * len(table) + 65


def test_a_call_too_big_for_the_share_displaces_nobody() -> None:
    pool = CountingPool()
    table = ProtectedPrograms(RetentionSettings(max_protected_programs=1), pool, 4,
                              clock=Clock())  # a share of 2 blocks
    assert table.protect("p", [object()], 10.0)
    assert not table.protect("q", [object()] * 3, 1.0)
    assert set(table.programs) == {"p"} and table.refused == 1 and pool.freed == 0


def test_settings_defaults_bounds_and_flags() -> None:
    assert from_table(RetentionSettings, {"engine_id": "e"}) == RetentionSettings()
    assert from_table(RetentionSettings, {"retention_ttl_s": 5}).retention_ttl_s == 5.0
    for bad in ({"retention_ttl_s": -1}, {"max_protected_programs": 1.5},
                {"max_protected_fraction": 0}, {"retention_slack": 0.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            from_table(RetentionSettings, bad)
    ns, rest = build_parser().parse_known_args([
        "--model", "/models/m", "--retention-ttl-s", "12", "--max-protected-programs", "8"])
    argv = vllm_argv(ns, rest)
    table = json.loads(argv[argv.index("--additional-config") + 1])["hetserve"]
    assert table["retention_ttl_s"] == 12.0 and table["max_protected_programs"] == 8
    ns, rest = build_parser().parse_known_args(["--model", "/m", "--retention-slack", "0.5"])
    with pytest.raises(ValueError, match="retention_slack"):
        vllm_argv(ns, rest)
