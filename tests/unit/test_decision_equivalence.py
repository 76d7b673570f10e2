"""The cheaper decision path (issue 33) decides as the code before it: every decision of a
seeded scenario equals the one recorded at 6077a43, the commit before the change
(``tests/fixtures/decisions.json``).

The scenario routes bursts of requests through a real ``RouterCore`` (static priors, no
trained predictor: the predictors' own outputs are compared with their first forms in
their tests) over 2, 16 and 64 engines of three models with random scheduler snapshots
and prefix caches: programs that stick to their model, budgets and weights, requested
models, decisions left in flight so the load moves. Each decision's engine, model,
priority, predicted tokens, max_tokens, cached tokens and info must be equal, floats bit
for bit (JSON keeps a float's shortest repr, which round-trips). Engine affinity (issue 58,
``router.policies.affinity``), which came later and changes where programs go on
purpose, is off here (tests/unit/test_affinity.py tests it). Rewrite the fixture only
on a tree whose decisions are meant to change: ``python -m tests.unit.test_decision_equivalence``.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import msgspec

from engine_ext.telemetry import BlockStored, KVEventBatch, SchedulerSnapshot, encode_snapshot
from router.dispatch.core import RouterCore
from router.state.kv_hash import BlockHasher
from router.request import Workflow
from router.types import Decision, RoutingRequest
from tests.remote_cluster import remote_cluster

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "decisions.json"
MODELS = ("small", "mid", "large")
BLOCK = 16
POLICIES: dict[str, dict[str, Any]] = {
    "chimera": {"static_prior": True, "tau": 0.3, "delta_s": 0.05,
                "confidence": {"small": 0.55, "mid": 0.7, "large": 0.8},
                "mean_output_tokens": {"small": 150, "mid": 220, "large": 300},
                "decode_ms_per_token": {"small": 4.0, "mid": 9.0, "large": 15.0},
                "max_batch_size": {"small": 64, "mid": 48, "large": 32}},
    "routebalance": {"static_prior": True, "max_batch": 8, "max_window_ms": 5.0,
                     "quality": {"small": 0.55, "mid": 0.7, "large": 0.8},
                     "mean_output_tokens": {"small": 150, "mid": 220, "large": 300},
                     "decode_ms_per_token": {"small": 4.0, "mid": 9.0, "large": 15.0},
                     "cost_per_token": {"small": 1e-7, "mid": 2e-7, "large": 4e-7}},
    "laar": {"static_prior": True, "capability": {"small": 0.55, "mid": 0.7, "large": 0.8},
             "mean_output_tokens": {"small": 150, "mid": 220, "large": 300},
             "decode_ms_per_token": {"small": 4.0, "mid": 9.0, "large": 15.0}},
    "lmetric": {},
}
ENGINES = (2, 16, 64)


def _core(policy: str, engines: int, rng: random.Random) -> tuple[RouterCore, list[list[int]]]:
    names = {f"e{i:03d}": MODELS[i % len(MODELS)] for i in range(engines)}
    core = RouterCore(remote_cluster(policy, names, max_model_len=4096,
                                     policies={policy: POLICIES[policy]},
                                     heartbeat_timeout_s=1e9, program_affinity=False),
                      None)
    core.build_policy()
    hasher = BlockHasher()
    prefixes = [[rng.randrange(3, 4000) for _ in range(4 * BLOCK)] for _ in range(6)]
    for name in names:
        snap = SchedulerSnapshot(
            engine_id=name, seq=0, ts=0.0, step=1, batch_size=rng.randrange(0, 32),
            num_waiting=rng.randrange(0, 8), queued_prefill_tokens=rng.randrange(0, 4000),
            pending_decode_tokens=rng.randrange(0, 8000), kv_usage=rng.random(),
            num_preemptions=0)
        core.membership.snapshots.feed([name.encode(), (0).to_bytes(8, "big"),
                                        encode_snapshot(snap)])
        held = rng.sample(prefixes, k=2)
        events = [BlockStored(block_hashes=list[int | bytes](hasher.block_hashes(p, BLOCK)),
                              parent_block_hash=None, token_ids=p, block_size=BLOCK)
                  for p in held]
        core.membership.kv_events.feed([name.encode(), (0).to_bytes(8, "big"),
                                        msgspec.msgpack.encode(KVEventBatch(ts=0.0,
                                                                            events=events))])
    return core, prefixes


def _request(i: int, rng: random.Random, prefixes: list[list[int]], engines: int
             ) -> RoutingRequest:
    ids = rng.choice(prefixes)[:rng.choice((BLOCK, 2 * BLOCK, 4 * BLOCK))] + \
        [rng.randrange(3, 4000) for _ in range(rng.randrange(0, 40))]
    stages = rng.randrange(1, 5)
    meta = Workflow(program_id=f"p{rng.randrange(12)}" if rng.random() < 0.8 else None,
                    workflow="w", stage_index=rng.randrange(stages), num_stages=stages,
                    budget=rng.choice((None, None, 1e-5, 3e-5, 1e-3)),
                    weights=rng.choice(({}, {}, {"quality": 2.0, "latency": 1.0},
                                        {"cost": 1.0})))
    model = rng.choice((None,) * 6 + MODELS[:min(engines, len(MODELS))])
    return RoutingRequest(request_id=f"q{i}", requested_model=model, prompt_token_ids=ids,
                          num_prompt_tokens=len(ids), max_tokens=rng.choice((None, 64, 256)),
                          workflow=meta)


def _record(out: Decision | BaseException) -> Any:
    if isinstance(out, BaseException):
        return f"{type(out).__name__}: {out}"
    return [out.request_id, out.instance, out.model, out.priority,
            out.predicted_remaining_tokens, out.max_tokens, out.cached_tokens,
            sorted(out.info.items())]


async def _scenario(policy: str, engines: int) -> list[Any]:
    rng = random.Random(f"{policy}-{engines}")
    core, prefixes = _core(policy, engines, rng)
    log: list[Any] = []
    serial = 0
    for _ in range(60):
        burst = [_request(serial + k, rng, prefixes, engines)
                 for k in range(rng.choice((1, 1, 4, 8)))]
        serial += len(burst)
        outs = await asyncio.gather(*(core.routing.route(r) for r in burst),
                                    return_exceptions=True)
        log += [_record(o) for o in outs]
        for o in outs:  # about half end at once; the rest stay in flight
            if isinstance(o, Decision) and rng.random() < 0.5:
                core.routing.on_complete(o, rng.randrange(1, 300), None)
    await core.routing.stop()
    return log


def scenario() -> dict[str, list[Any]]:
    """Every policy's decisions, by ``policy/engines``."""
    return {f"{p}/{n}": asyncio.run(_scenario(p, n)) for p in POLICIES for n in ENGINES}


def test_decisions_equal_those_before_the_change() -> None:
    want = json.loads(FIXTURE.read_text())
    got = json.loads(json.dumps(scenario()))
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key]), key
        for g, w in zip(got[key], want[key]):
            assert g == w, key
    decided = sum(1 for log in want.values() for d in log if not isinstance(d, str))
    assert decided > 1000  # the scenario decides, it does not only fail


def write(logs: dict[str, list[Any]]) -> None:
    """The fixture, one decision a line."""
    parts = [f"{json.dumps(key)}: [\n" + ",\n".join(json.dumps(d) for d in log) + "\n]"
             for key, log in logs.items()]
    FIXTURE.write_text("{\n" + ",\n".join(parts) + "\n}\n")


if __name__ == "__main__":
    write(scenario())
    print(f"wrote {FIXTURE}")
