"""Batched predictor service (Chimera 3.8): the collector's size / timeout batching, a
worker process pool, the same answers as direct calls, start-up failure on a broken
artifact."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from router.predictors.artifact import ArtifactError
from router.predictors.capability import CapabilityModel, CapabilitySettings
from router.predictors.features import RequestFeatures, from_record
from router.predictors.length import LengthPredictor, LengthSettings
from router.predictors.loader import close_predictors, load_predictors
from router.predictors.service import Collector, ServedLength, ServiceSettings
from router.predictors.table import prompt_table
from router.types import Overloaded
from tests.fixtures.predictors import request, split

MODELS = ["synthetic-large", "synthetic-small"]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    train, _ = split()
    root = tmp_path_factory.mktemp("artifacts")
    info = {"seed": 0, "holdout": 0.2}
    LengthPredictor.train(train, LengthSettings(n_estimators=20), progress=False) \
        .save(root / "length", info)
    CapabilityModel.train(prompt_table(train, MODELS, True), CapabilitySettings()) \
        .save(root / "capability", info)
    return {"length": str(root / "length"), "capability": str(root / "capability")}


def test_same_answers_as_direct_calls(artifacts: dict[str, str]) -> None:
    _, test = split()
    reqs = [request(r, str(i)) for i, r in enumerate(test[:40])]
    direct = load_predictors(artifacts, MODELS)
    served = load_predictors(artifacts, MODELS,
                             service=ServiceSettings(max_batch=16, inline_max_ms=0))
    assert isinstance(served.length, ServedLength)

    async def both() -> tuple[Any, ...]:
        assert direct.length is not None and served.length is not None
        assert direct.capability is not None and served.capability is not None
        singles = await asyncio.gather(*(served.length.remaining_tokens([r]) for r in reqs))
        return (await direct.length.remaining_tokens(reqs),
                await served.length.remaining_tokens(reqs), [s[0] for s in singles],
                await direct.capability.capability(reqs),
                await served.capability.capability(reqs))

    try:
        want, batched, singles, cap_want, cap_got = asyncio.run(both())
        assert batched == want and singles == want and cap_got == cap_want
        assert asyncio.run(served.length.remaining_tokens(reqs[:3])) == want[:3]  # new loop
    finally:
        close_predictors(served)


def test_event_loop_runs_while_the_pool_predicts(artifacts: dict[str, str]) -> None:
    """A direct call runs the forest inside the event loop (nothing else runs until it
    returns); through the service the loop keeps running other tasks meanwhile."""
    _, test = split()
    reqs = [request(r, str(i)) for i, r in enumerate(test[:64])]
    direct = load_predictors(artifacts, MODELS)
    served = load_predictors(artifacts, MODELS, service=ServiceSettings(inline_max_ms=0))

    async def ticks_during(call: Any) -> int:
        ticks, done = 0, False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(ticker())
        await call(reqs)
        done = True
        await task
        return ticks

    try:
        assert asyncio.run(ticks_during(direct.length.remaining_tokens)) == 0
        assert asyncio.run(ticks_during(served.length.remaining_tokens)) > 0
    finally:
        close_predictors(served)


def test_placement_by_measured_cost(artifacts: dict[str, str]) -> None:
    """A predictor runs in the router process when its timed call costs at most
    ``inline_max_ms``, else behind the pool; the timings are kept on the set."""
    inline = load_predictors(artifacts, MODELS, service=ServiceSettings(inline_max_ms=1e9))
    assert isinstance(inline.length, LengthPredictor)
    assert isinstance(inline.capability, CapabilityModel)
    assert sorted(inline.call_ms) == ["capability", "length"]
    assert all(ms > 0 for ms in inline.call_ms.values())
    close_predictors(inline)  # nothing to stop: no pool was started
    pooled = load_predictors(artifacts, MODELS, service=ServiceSettings(inline_max_ms=0))
    try:
        assert isinstance(pooled.length, ServedLength)
        assert not isinstance(pooled.capability, CapabilityModel)
    finally:
        close_predictors(pooled)
    assert load_predictors(artifacts, MODELS).call_ms == {}  # no service: nothing timed


def test_broken_artifact_fails_at_start(artifacts: dict[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "length"
    shutil.copytree(artifacts["length"], broken)
    (broken / "model.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ArtifactError, match="cannot load length"):
        load_predictors({"length": str(broken)}, MODELS, service=ServiceSettings())


FEAT = from_record(split()[1][0])


def collect(n: int, max_batch: int, max_wait_s: float, fail: bool = False
            ) -> tuple[list[int], list[Any]]:
    sizes: list[int] = []

    async def run_batch(feats: list[RequestFeatures]) -> list[int]:
        sizes.append(len(feats))
        await asyncio.sleep(0.01)
        if fail:
            raise RuntimeError("model exploded")
        return list(range(len(feats)))

    async def go() -> list[Any]:
        c = Collector(run_batch, max_batch, max_wait_s, parallel=2)
        try:
            return list(await asyncio.gather(*(c.put(FEAT) for _ in range(n)),
                                             return_exceptions=True))
        finally:
            c.stop()

    return sizes, asyncio.run(go())


def test_collector_closes_batches_at_max_size() -> None:
    sizes, results = collect(70, max_batch=32, max_wait_s=0.2)
    assert sizes == [32, 32, 6] and results == [*range(32), *range(32), *range(6)]


def test_collector_closes_batches_at_timeout() -> None:
    sizes, _ = collect(5, max_batch=64, max_wait_s=0.005)
    assert sizes == [5]


def test_collector_hands_failures_to_every_waiter() -> None:
    _, results = collect(3, max_batch=8, max_wait_s=0.001, fail=True)
    assert all(isinstance(r, RuntimeError) for r in results)


def test_a_full_queue_sheds_and_a_cancelled_request_costs_no_inference() -> None:
    """Overload: beyond ``max_queue`` waiting requests ``put`` raises Overloaded (the
    front's 503); a request whose client left (its future cancelled) is not predicted."""
    sizes: list[int] = []
    release = asyncio.Event()

    async def run_batch(feats: list[RequestFeatures]) -> list[int]:
        sizes.append(len(feats))
        await release.wait()
        return list(range(len(feats)))

    async def go() -> list[Any]:
        c = Collector(run_batch, max_batch=4, max_wait_s=0.001, parallel=1, max_queue=6)
        try:
            first = [c.put(FEAT) for _ in range(4)]
            await asyncio.sleep(0.05)  # the first batch runs (and holds the only slot)
            queued = [c.put(FEAT) for _ in range(6)]
            with pytest.raises(Overloaded, match="6 requests already wait"):
                c.put(FEAT)
            for fut in queued[:5]:  # their clients left
                fut.cancel()
            release.set()
            return list(await asyncio.gather(*first, queued[5]))
        finally:
            c.stop()

    assert asyncio.run(go()) == [0, 1, 2, 3, 0]
    assert sizes == [4, 1]
