"""The router's KV prefix index against a real engine (engine_ext.serve, builtin:tiny-a,
block size 128 on CPU): the block hashes the engine reports in BlockStored equal the
router's own, and the router's predicted cached tokens equal the engine's reported
``usage.prompt_tokens_details.cached_tokens``, for token-id prompts and for chat
requests tokenized by the router front. The engine is ``a`` of tests/tiny_pair.py; every
prompt here is this module's own, so what other modules left in its cache meets none."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from typing import Any, Iterator

import httpx
import pytest
import zmq

from engine_ext.telemetry import BlockStored, kv_event_decoder
from router.dispatch.core import RouterCore
from router.admission.parse import parse_request
from router.tokenize import Tokenizers
from router.types import Decision, RoutingRequest
from tests.engine_proc import EngineProc
from tests.remote_cluster import remote_cluster
from tests.tiny_pair import TinyPair

pytestmark = pytest.mark.engine

BLOCK = 128
MODEL = "tiny-a"
ENGINE_ID = "a-0"


class StoredEvents:
    """A second subscriber recording every BlockStored the engine publishes."""

    def __init__(self, endpoint: str) -> None:
        self.hashes: list[int | bytes] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._decoder = kv_event_decoder()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(100):
                got = self._decoder.decode(self._sock.recv_multipart())
                if got is not None:
                    self.hashes += [h for ev in got[2].events if isinstance(ev, BlockStored)
                                    for h in ev.block_hashes]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(0)
        self._ctx.term()


@pytest.fixture(scope="module")
def engine(tiny_pair: TinyPair) -> EngineProc:
    tiny_pair.revive()
    d = tiny_pair.d
    return EngineProc(ENGINE_ID, tiny_pair.ports["a"], tiny_pair.procs["a"], tiny_pair.log("a"),
                      f"ipc://{d}/{ENGINE_ID}.telemetry", f"ipc://{d}/{ENGINE_ID}.kv")


def make_core(engine: EngineProc) -> RouterCore:
    return RouterCore(remote_cluster(
        "lmetric", {engine.engine_id: MODEL}, max_model_len=1024, url=engine.url,
        endpoints=(engine.telemetry_endpoint, engine.kv_events_endpoint),
        heartbeat_timeout_s=5.0))


class Harness:
    def __init__(self, engine: EngineProc, core: RouterCore, http: httpx.AsyncClient,
                 events: StoredEvents) -> None:
        self.engine, self.core, self.http, self.events = engine, core, http, events
        self.n = 0

    async def send(self, path: str, body: dict[str, Any], req: RoutingRequest
                   ) -> tuple[Decision, int]:
        """Route ``req``, send ``body`` to the engine, return (decision, engine-reported
        cached tokens), and wait until the engine's KV events for it have arrived."""
        decision = await self.core.routing.route(req)
        resp = await self.http.post(self.engine.url + path, json=body,
                                    headers={"x-request-id": req.request_id})
        resp.raise_for_status()
        self.core.routing.on_complete(decision, None, None)
        details = resp.json()["usage"].get("prompt_tokens_details") or {}
        kv = self.core.state.table[decision.instance].kv
        stored = self.core.state.hasher.block_hashes(req.prompt_token_ids or [], BLOCK)
        for _ in range(200):  # until the engine's events for the prompt's blocks arrived
            if kv.match(stored) == len(stored):
                break
            await asyncio.sleep(0.05)
        return decision, int(details.get("cached_tokens") or 0)

    async def completion(self, ids: list[int]) -> tuple[Decision, int]:
        self.n += 1
        req = RoutingRequest(request_id=f"c{self.n}", requested_model=MODEL,
                             prompt_token_ids=ids, num_prompt_tokens=len(ids), max_tokens=1)
        body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0}
        return await self.send("/v1/completions", body, req)


@pytest.fixture
def run(engine: EngineProc) -> Iterator[Any]:
    """Run a scenario coroutine with a started core, an HTTP client and an event tap."""

    def runner(scenario: Any) -> Any:
        async def main() -> Any:
            core = make_core(engine)
            await core.start()
            events = StoredEvents(engine.kv_events_endpoint)
            await asyncio.sleep(0.3)  # subscriptions settle before the first event
            try:
                async with httpx.AsyncClient(timeout=120) as http:
                    return await scenario(Harness(engine, core, http, events))
            finally:
                events.close()
                await core.stop()
        return asyncio.run(main())
    yield runner


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 4000) for _ in range(n)]


def test_block_stored_hashes_equal_the_routers(run: Any) -> None:
    ids = random_ids(300, seed=1)

    async def scenario(h: Harness) -> None:
        decision, cached = await h.completion(ids)
        assert (decision.cached_tokens, cached) == (0, 0)
        ours = h.core.state.hasher.block_hashes(ids, BLOCK)
        assert len(ours) == 2 and h.core.state.table[ENGINE_ID].kv.block_size == BLOCK
        for _ in range(100):
            if h.events.hashes[-2:] == ours:
                break
            await asyncio.sleep(0.05)
        assert h.events.hashes[-2:] == ours
        assert h.core.state.table[ENGINE_ID].kv.match(ours) == 2
    run(scenario)


@pytest.mark.parametrize("n,shared,expected", [
    (300, 300, 256),   # repeated prompt: two full blocks cached
    (256, 256, 128),   # exactly two blocks: the last token is recomputed, one block hits
    (300, 200, 128),   # only the first block is shared
    (100, 100, 0),     # shorter than a block: nothing is ever cached
])
def test_predicted_cached_tokens_equal_the_engines(run: Any, n: int, shared: int,
                                                   expected: int) -> None:
    first = random_ids(n, seed=n + shared)
    second = first[:shared] + random_ids(n - shared, seed=7 * n + shared)

    async def scenario(h: Harness) -> None:
        await h.completion(first)
        decision, cached = await h.completion(second)
        assert (decision.cached_tokens, cached) == (expected, expected)
    run(scenario)


def test_chat_prompts_tokenized_by_the_front_match_the_engine(run: Any) -> None:
    tokenizers = Tokenizers({MODEL: f"builtin:{MODEL}"})
    tokenizers.load()
    system = "You are a careful assistant. " * 40

    async def chat(h: Harness, rid: str, user: str) -> tuple[Decision, int]:
        body = {"model": MODEL, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": user}]}
        parsed = parse_request("chat", json.dumps(body).encode(), {})
        info = await tokenizers.prompt(MODEL, parsed)
        req = RoutingRequest(request_id=rid, requested_model=MODEL, max_tokens=1,
                             prompt_text=info.text, system_text=info.system_text,
                             user_text=info.user_text, prompt_token_ids=info.token_ids,
                             num_prompt_tokens=len(info.token_ids))
        assert req.num_prompt_tokens > 2 * BLOCK
        return await h.send("/v1/chat/completions", body, req)

    async def scenario(h: Harness) -> None:
        await chat(h, "chat1", "What is a prefix cache?")
        decision, cached = await chat(h, "chat2", "What is a KV block?")
        assert decision.cached_tokens == cached and cached >= 2 * BLOCK
    run(scenario)
