"""STJF with aging inside vLLM's real Scheduler (no model executor; see kernels_bench.lib.scheduler_harness)."""

import random
import time

import pytest

pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus  # noqa: E402

from engine_ext.schedulers import (  # noqa: E402
    MLFQScheduler,
    STJFAsyncScheduler,
    STJFScheduler,
    VLLMScheduler,
    scheduler_class,
)
from kernels_bench.lib.scheduler_harness import (  # noqa: E402
    add_all, make_request, make_scheduler, step)
from scheduler_patches.queues import KeyedRequestQueue  # noqa: E402


def admission_order(sched, max_steps=10_000, arrivals=None):
    """Run until idle; return request ids in the order they were first scheduled."""
    order = []
    for i in range(max_steps):
        if arrivals and i in arrivals:
            add_all(sched, arrivals[i])
        if not sched.has_requests() and not (arrivals and any(k > i for k in arrivals)):
            break
        out, _ = step(sched)
        order += [r.req_id for r in out.scheduled_new_reqs]
    return order


def test_waiting_queue_is_replaced_by_keyed_queue():
    s = make_scheduler(STJFScheduler)
    assert isinstance(s.waiting, KeyedRequestQueue)
    assert isinstance(s.kv_holding_waiting, KeyedRequestQueue)


@pytest.mark.parametrize("cls", [STJFScheduler, STJFAsyncScheduler])
def test_service_order_follows_key(cls):
    s = make_scheduler(cls, max_num_seqs=1, hetserve={"starvation_threshold": 10**6})
    add_all(s, [
        make_request("long", priority=900, arrival_time=1),
        make_request("short", priority=5, arrival_time=2),
        make_request("mid", priority=50, arrival_time=3),
        make_request("mid-later", priority=50, arrival_time=4),
        make_request("unknown", priority=0, arrival_time=0),
    ])
    assert admission_order(s) == ["short", "mid", "mid-later", "long", "unknown"]


def test_thousands_of_requests_come_out_sorted():
    rng = random.Random(0)
    s = make_scheduler(STJFScheduler, max_num_seqs=4, hetserve={"starvation_threshold": 10**6})
    reqs = [make_request(f"r{i}", priority=rng.randint(1, 10_000), arrival_time=float(i),
                         max_tokens=1, prompt_len=4, first_token=i) for i in range(3000)]
    add_all(s, reqs)
    order = admission_order(s)
    expected = [r.request_id for r in sorted(reqs, key=lambda r: (r.priority, r.arrival_time))]
    assert order == expected


@pytest.mark.parametrize("cls", [STJFScheduler, STJFAsyncScheduler])
def test_starved_request_is_promoted_after_S_pass_overs(cls):
    S = 5
    s = make_scheduler(cls, max_num_seqs=1,
                       hetserve={"starvation_threshold": S, "quantum": 1000})
    add_all(s, [make_request("low", priority=10_000, arrival_time=0, max_tokens=2)])
    # A stream of short, high-priority requests: one new arrival every step.
    arrivals = {i: [make_request(f"short{i}", priority=1, arrival_time=1 + i, max_tokens=2,
                                 first_token=100 + i)] for i in range(0, 60)}
    order = admission_order(s, arrivals=arrivals)
    # Without aging "low" would wait for all 60 short ones. With it, it is promoted after
    # S pass-overs and admitted as soon as the running short request finishes (2 steps).
    position = order.index("low")
    assert position < 60
    assert position <= S  # at most one admission per 2 steps while it waits S steps


def test_no_aging_starves_without_promotion():
    s = make_scheduler(STJFScheduler, max_num_seqs=1, hetserve={"starvation_threshold": 10**6})
    add_all(s, [make_request("low", priority=10_000, arrival_time=0, max_tokens=2)])
    arrivals = {i: [make_request(f"short{i}", priority=1, arrival_time=1 + i, max_tokens=2,
                                 first_token=100 + i)] for i in range(0, 20)}
    order = admission_order(s, arrivals=arrivals)
    assert order[-1] == "low"


def test_demotion_after_Q_scheduling_iterations():
    s = make_scheduler(STJFScheduler, max_num_seqs=1,
                       hetserve={"starvation_threshold": 2, "quantum": 3})
    add_all(s, [make_request("first", priority=1, max_tokens=3),
                make_request("starved", priority=100, arrival_time=1, max_tokens=50)])
    levels = []
    for _ in range(12):
        step(s)
        entry = s.aging.entries.get("starved")
        levels.append(entry.level if entry else None)
    # Promoted while waiting behind "first", then demoted after 3 scheduled iterations.
    assert -1 in levels
    first_promoted = levels.index(-1)
    assert levels[first_promoted:first_promoted + 5].count(-1) <= 4
    assert levels[-1] == 0


def _preemption_victim(cls, **kw):
    # 11 blocks of 16 tokens (one is vLLM's null block): two 64-token prompts fill 8,
    # and growing past 80 tokens each forces a preemption.
    s = make_scheduler(cls, max_num_seqs=2, num_blocks=11, **kw)
    worst = make_request("worst", priority=9000, arrival_time=0, prompt_len=64,
                         max_tokens=100, first_token=0)
    best = make_request("best", priority=1, arrival_time=1, prompt_len=64,
                        max_tokens=100, first_token=500)
    s.add_request(worst)
    step(s)  # "worst" is admitted first...
    s.add_request(best)
    for _ in range(40):
        step(s)
        if worst.num_preemptions or best.num_preemptions:
            break
    return worst, best


@pytest.mark.parametrize("cls", [STJFScheduler, STJFAsyncScheduler])
def test_preemption_victim_is_worst_key_not_last_admitted(cls):
    worst, best = _preemption_victim(cls, hetserve={"starvation_threshold": 10**6})
    assert worst.num_preemptions == 1 and best.num_preemptions == 0
    assert worst.status == RequestStatus.PREEMPTED


def test_stock_fcfs_preempts_last_admitted():
    # The baseline the test above differs from: vLLM's FCFS evicts running[-1].
    worst, best = _preemption_victim(VLLMScheduler)
    assert best.num_preemptions == 1 and worst.num_preemptions == 0


def test_abort_of_waiting_request_removes_it_and_its_aging_state():
    s = make_scheduler(STJFScheduler, max_num_seqs=1)
    add_all(s, [make_request(f"r{i}", priority=i + 1, arrival_time=i) for i in range(5)])
    step(s)
    s.finish_requests(["r3", "r4"], RequestStatus.FINISHED_ABORTED)
    assert len(s.waiting) == 2
    assert "r3" not in s.aging.entries and "r4" not in s.aging.entries
    assert admission_order(s) == ["r1", "r2"]
    assert s.aging.entries == {}


def test_abort_of_running_request_frees_its_state():
    s = make_scheduler(STJFScheduler, max_num_seqs=1)
    add_all(s, [make_request("a", priority=1, max_tokens=50), make_request("b", priority=2)])
    step(s)
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert "a" not in s.aging.entries
    assert admission_order(s) == ["b"]


def test_mlfq_orders_by_level_then_arrival():
    s = make_scheduler(MLFQScheduler, max_num_seqs=1,
                       hetserve={"mlfq_levels": 3, "mlfq_base_quantum": 4})
    add_all(s, [make_request(f"r{i}", arrival_time=i, max_tokens=2) for i in range(4)])
    assert admission_order(s) == ["r0", "r1", "r2", "r3"]
    assert s.mlfq.level(0) == 0 and s.mlfq.level(4) == 1 and s.mlfq.level(12) == 2
    assert s.mlfq.level(10**6) == 2


def test_async_variant_is_an_async_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert issubclass(STJFAsyncScheduler, AsyncScheduler)
    assert scheduler_class("stjf", True).endswith("STJFAsyncScheduler")
    assert scheduler_class("stjf", False).endswith(".STJFScheduler")
    with pytest.raises(ValueError, match="unknown engine policy"):
        scheduler_class("sjf", False)


@pytest.mark.parametrize("cls,policy", [(STJFScheduler, "priority"), (VLLMScheduler, "fcfs"),
                                        (VLLMScheduler, "priority"), (MLFQScheduler, "priority")])
def test_snapshot_counts_match_a_full_walk(cls, policy):
    """The O(1) prefill-token ledger agrees with walking the queues, through admissions,
    preemptions (KV pressure) and aborts."""
    s = make_scheduler(cls, policy=policy, max_num_seqs=3, num_blocks=20)
    add_all(s, [make_request(f"r{i}", priority=i + 1, arrival_time=i, prompt_len=20 + i,
                             max_tokens=100, first_token=50 * i) for i in range(8)])

    def walk() -> int:
        waiting = [r for q in (s.waiting, s.kv_holding_waiting) for r in q]
        return (sum(r.num_tokens - r.num_computed_tokens for r in waiting)
                + sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in s.running))

    preempted = False
    for i in range(150):
        step(s)
        if i == 5:
            s.finish_requests(["r6"], RequestStatus.FINISHED_ABORTED)
        snap = s.snapshot(i)
        assert snap.queued_prefill_tokens == walk()
        assert snap.num_waiting == len(s.waiting) + len(s.kv_holding_waiting)
        preempted |= snap.num_preemptions > 0
    assert preempted  # the KV pressure path was exercised


def test_going_idle_publishes_state_and_finished_at_once(tmp_path):
    """A burst shorter than the rate limit still reports its finished requests."""
    import zmq

    from engine_ext.telemetry import snapshot_decoder

    endpoint = f"ipc://{tmp_path}/t"
    s = make_scheduler(STJFScheduler, hetserve={
        "engine_id": "e", "telemetry_endpoint": endpoint, "telemetry_interval_ms": 60_000})
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        decoder = snapshot_decoder()
        assert sub.poll(5000)  # the startup announcement (sent before we subscribed) or a beat
        for round_ in range(2):  # the second burst starts from an idle, published state
            add_all(s, [make_request(f"b{round_}", max_tokens=2, first_token=round_)])
            step(s)
            step(s)
            assert not s.running and not s.waiting
            deadline = time.time() + 5
            got = []
            while time.time() < deadline and not any(f for g in got for f in g.finished):
                if sub.poll(200):
                    got.append(decoder.decode(sub.recv_multipart())[2])
            finished = [f for g in got for f in g.finished]
            assert [f.request_id for f in finished] == [f"b{round_}"]
            assert finished[0].output_tokens == 2 and got[-1].batch_size == 0
    finally:
        s.shutdown()
        sub.close(linger=0)
        ctx.term()


def test_each_scheduler_reads_its_settings_from_the_hetserve_table():
    s = make_scheduler(STJFScheduler, hetserve={
        "engine_id": "e1", "starvation_threshold": 7, "quantum": 5, "max_promotions": 2,
        "telemetry_interval_ms": 0, "mlfq_levels": 9})
    assert (s.aging.settings.starvation_threshold, s.aging.settings.quantum,
            s.aging.settings.max_promotions, s.engine_id) == (7, 5, 2, "e1")
    m = make_scheduler(MLFQScheduler, hetserve={"mlfq_levels": 2, "quantum": 5})
    assert (m.mlfq.mlfq_levels, m.mlfq.mlfq_base_quantum) == (2, 64)
    with pytest.raises(ValueError, match=r"^additional_config\.hetserve\.quantum: .*got '8'"):
        make_scheduler(STJFScheduler, hetserve={"quantum": "8"})


@pytest.mark.parametrize("flags, key", [
    (["--starvation-threshold", "0"], "starvation_threshold"),
    (["--max-promotions", "-1"], "max_promotions"),
    (["--mlfq-levels", "0"], "mlfq_levels"),
    (["--retention-slack", "0.5"], "retention_slack"),
    (["--telemetry-interval-ms", "-1"], "telemetry_interval_ms"),
])
def test_engine_server_refuses_a_bad_setting_before_vllm_starts(flags, key):
    from engine_ext.serve import build_parser, vllm_argv

    ns, rest = build_parser().parse_known_args(["--model", "/models/m", *flags])
    with pytest.raises(ValueError, match=rf"^additional_config\.hetserve\.{key}: "):
        vllm_argv(ns, rest)
