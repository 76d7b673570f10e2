"""One engine twin: exact step arithmetic with chunked prefill and prefix caching, and the
engine's own scheduler class deciding the order."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")
from vllm.v1.core.sched.scheduler import Scheduler

from engine_ext.schedulers import STJFScheduler, VLLMScheduler
from kernels_bench.lab.twin.request import RequestRecord, TwinRequest
from kernels_bench.lab.twin.sim import Simulator
from kernels_bench.lab.twin.step_time import StepTimeModel, load_profile
from router.policies.base import priority_for
from tests.lab.twin_helpers import flat_spec, profile_dict, write_profile

FLAT = [(1, 128, 10.0, 10.0, 10.0), (8, 128, 10.0, 10.0, 10.0)]
"""Decode step 10 ms at any batch and context."""


def run_flat(tmp_path: Path, policy: str, max_num_seqs: int,
             arrivals: list[tuple[float, TwinRequest]],
             stock: bool = False) -> tuple[Simulator, list[str]]:
    sim = Simulator()
    model = StepTimeModel(write_profile(tmp_path / "e.json", FLAT, prefill_ms_per_token=1.0))
    spec = flat_spec("e-0", policy, max_num_seqs=max_num_seqs)
    sim.add_engine(dataclasses.replace(spec, stock=stock), model)
    order: list[str] = []
    sim.on_finish(lambda r: order.append(r.request_id))
    for at, request in arrivals:
        sim.submit("e-0", request, at)
    sim.run()
    return sim, order


def test_hand_computed_completion_times(tmp_path: Path) -> None:
    """Profile: decode step 10 ms at any batch, prefill 1 ms per prompt token. Engine:
    FCFS, 16-token blocks, max_num_batched_tokens 256 (chunked prefill), 8 sequences.
    A: 300 prompt tokens, 3 output tokens, arrives at 0 s. B: 100 prompt tokens whose
    first 64 are A's, 2 output tokens, arrives at 0.100 s.

    step 1, 0.000-0.256: A's first chunk, 256 tokens (the budget): 256 ms, no token.
    step 2, 0.256-0.336: B joined the queue at 0.100 (between steps). A's last 44 prompt
      tokens, then B: its first 4 blocks (64 tokens) are A's, cached since step 1, so 36
      tokens to compute: 80 tokens, 80 ms. Both prompts complete: first tokens at 0.336.
    step 3, 0.336-0.346: A and B decode (10 ms): B has its 2 tokens, finishes at 0.346.
    step 4, 0.346-0.356: A decodes its 3rd token, finishes at 0.356.
    """
    a_prompt = tuple(range(100, 400))
    b_prompt = a_prompt[:64] + tuple(range(1000, 1036))
    sim, order = run_flat(tmp_path, "fcfs", 8, [(0.0, TwinRequest("A", a_prompt, 3)),
                                                (0.1, TwinRequest("B", b_prompt, 2))])
    twin = sim.engines["e-0"]
    a, b = twin.records["A"], twin.records["B"]
    assert order == ["B", "A"] and twin.steps == 4
    exact = pytest.approx  # float sums of milliseconds: equal to 1e-12 s
    assert (a.arrival, a.first_scheduled, a.cached_tokens) == (0.0, 0.0, 0)
    assert (a.first_token, a.finish) == (exact(0.336, abs=1e-12), exact(0.356, abs=1e-12))
    assert (b.arrival, b.cached_tokens) == (0.1, 64)
    assert b.first_scheduled == exact(0.256, abs=1e-12)
    assert (b.first_token, b.finish) == (exact(0.336, abs=1e-12), exact(0.346, abs=1e-12))
    assert (a.generated, b.generated) == (3, 2)
    assert sim.now() == exact(0.356, abs=1e-12)



def test_prefill_attention_grows_with_the_context_of_each_chunk(tmp_path: Path) -> None:
    """Prefill 1 ms per token and A = 0.01 ms per (new, attended) token pair. A: 300
    prompt tokens, 1 output token, chunks of 256. Step 1: 256 tokens on 0 computed, 256 +
    0.01 x 256 x 128 = 583.68 ms; step 2: 44 tokens on 256 computed, 44 + 0.01 x 44 x
    (256 + 22) = 166.32 ms: the first (and last) token at 0.75 s."""
    path = tmp_path / "a.json"
    path.write_text(json.dumps({**profile_dict(FLAT, 1.0),
                                "prefill_attention_ms_per_pair": 0.01}))
    sim = Simulator()
    sim.add_engine(flat_spec("e-0", "fcfs"), StepTimeModel(load_profile(path)))
    sim.submit("e-0", TwinRequest("A", tuple(range(100, 400)), 1), 0.0)
    sim.run()
    a = sim.engines["e-0"].records["A"]
    assert a.first_token == pytest.approx(0.75, abs=1e-12)
    assert sim.engines["e-0"].steps == 2

def finish_order(tmp_path: Path, policy: str, stock: bool = False
                 ) -> tuple[list[str], dict[str, RequestRecord]]:
    """One sequence at a time; long L1 arrives first and runs; long L2, short S and U
    (no prediction) arrive while it runs, with the priorities the router gives them:
    ``priority_for`` the predicted remaining tokens of their workflows, none for U (the
    engine sees NO_PRIORITY). ``stock``: a stock vLLM engine."""
    long_prio, short_prio = priority_for(400.0), priority_for(8.0)
    assert long_prio is not None and short_prio is not None
    sim, order = run_flat(tmp_path, policy, 1, [
        (0.000, TwinRequest("L1", tuple(range(100, 200)), 40, long_prio)),
        (0.001, TwinRequest("L2", tuple(range(200, 300)), 40, long_prio)),
        (0.002, TwinRequest("S", tuple(range(300, 400)), 4, short_prio)),
        (0.003, TwinRequest("U", tuple(range(400, 500)), 4)),
    ], stock)
    return order, sim.engines["e-0"].records


def test_stjf_class_serves_the_short_job_first_fcfs_does_not(tmp_path: Path) -> None:
    """STJF: S before L2, and U (no prediction) after every predicted request. vLLM's
    own priority policy would serve U first (priority 0 is its best); FCFS by arrival."""
    stjf, records = finish_order(tmp_path, "stjf")
    fcfs, _ = finish_order(tmp_path, "fcfs")
    assert stjf == ["L1", "S", "L2", "U"]
    assert fcfs == ["L1", "L2", "S", "U"]
    assert records["S"].first_scheduled == records["L1"].finish  # next in line after L1


def test_each_policy_runs_the_engines_scheduler_class(tmp_path: Path) -> None:
    model = StepTimeModel(write_profile(tmp_path / "e.json", FLAT, prefill_ms_per_token=1.0))
    sim = Simulator()
    stjf = sim.add_engine(flat_spec("s-0", "stjf"), model)
    fcfs = sim.add_engine(flat_spec("f-0", "fcfs"), model)
    assert type(stjf.scheduler) is STJFScheduler
    assert type(fcfs.scheduler) is VLLMScheduler
    assert stjf.scheduler.engine_id == "s-0"


def test_a_stock_engine_runs_vllms_own_scheduler(tmp_path: Path) -> None:
    """Stock vLLM with ``--scheduling-policy priority``: the late short S runs before the
    queued long L2, and U (priority 0, vLLM's best) before both, with no aging; with
    FCFS, arrival order. hetserve's priority engine (the telemetry mixin over the same
    class) orders its queue the same; the stock engine's class is vLLM's itself."""
    priority, records = finish_order(tmp_path, "priority", stock=True)
    assert priority == ["L1", "U", "S", "L2"]
    assert records["S"].first_scheduled < records["L2"].first_scheduled
    assert finish_order(tmp_path, "fcfs", stock=True)[0] == ["L1", "L2", "S", "U"]
    assert finish_order(tmp_path, "priority")[0] == priority
    model = StepTimeModel(write_profile(tmp_path / "e.json", FLAT, prefill_ms_per_token=1.0))
    twin = Simulator().add_engine(dataclasses.replace(flat_spec("e-0", "priority"), stock=True),
                                  model, telemetry=True)
    assert type(twin.scheduler) is Scheduler
    assert twin.snapshots is None and twin.kv_events is not None  # vLLM's KV events only
