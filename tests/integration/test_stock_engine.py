"""The router in front of an unmodified vLLM server beside a patched engine.

One module-scoped cluster: ``stock-0``, vLLM's own OpenAI server (``vllm serve``, the
``vllm`` command of the project's environment, with the priority scheduler, vLLM's KV
events to an ipc socket, its dev mode (``/pause``, ``/resume``), load tracking (``/load``),
request log and Responses store, all stock vLLM) and ``patched-0`` (``python -m engine_ext.serve``), both serving ``tiny-a``, and
``python -m router`` (``dynamo``, KV-aware) over both as remote engines: the stock one
``kind = "vllm"``, read by scraping its ``/metrics``. The tests run in file order; the
last one kills the stock engine and starts it again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_ext.builtin_models import resolve_model
from router.state.vllm_metrics import VllmMetrics, parse_metrics
from scheduler_patches.contract import PRIORITY_MAX
from tests.engine_proc import TINY_ENGINE_ARGS, free_port, kill_group, spawn, wait_healthy

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
HEALTH_TIMEOUT_S = 240.0
"""Two engines starting together on 2 shared cores take about 40 s; leave room."""
MODEL = "tiny-a"
MAX_NUM_SEQS = 1
"""The stock engine's slots: with one, the order its requests finish in is the order it
served them (the priority test)."""
SCRAPE_INTERVAL_MS, SCRAPE_TIMEOUT_S = 100, 15.0
CLIENTS = 4
"""Clients sending back to back in the load test (one slot: one runs, three wait)."""
LOAD_TOKENS = 900
"""Tokens of each load request: about 3 s of the engine's time here, so three requests
wait in its scheduler for seconds at a time (the load test's docstring says why)."""
LOAD_TIMEOUT_S = 180.0
"""The longest the load on the stock engine lasts, waiting for the router to see it."""
ARRIVAL_TIMEOUT_S = 120.0
"""The longest the priority test waits for its requests to reach the paused stock engine's
engine core (through the router; a second or two here)."""
KV_EVENT_TIMEOUT_S = 60.0
"""A prompt's blocks reach the router's index well within a second here; CI's busier
machine once missed 10 s (its cause unrecorded: a miss now says what the router knew)."""


@dataclass
class Cluster:
    d: Path
    router: str
    urls: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]]

    def health(self) -> dict[str, dict[str, Any]]:
        body = httpx.get(self.router + "/health", timeout=10).json()
        return {i["name"]: i for i in body["instances"]}

    def gauge(self, name: str, engine: str) -> float | None:
        text = httpx.get(self.router + "/metrics", timeout=10).text
        return next((s.value for f in text_string_to_metric_families(text)
                     for s in f.samples if s.name == name and s.labels.get("engine") == engine),
                    None)

    def scrapes(self, engine: str) -> dict[str, float]:
        """The router's scrapes of ``engine`` by outcome."""
        text = httpx.get(self.router + "/metrics", timeout=10).text
        return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "hetserve_scrapes_total" and s.labels.get("engine") == engine}

    def kv_diagnosis(self, engine: str) -> str:
        """What the router knows of ``engine``'s KV events, and its log's tail."""
        text = httpx.get(self.router + "/metrics", timeout=10).text
        seen = [f"{s.name}{dict(s.labels)}={s.value:g}"
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.labels.get("engine") == engine and ("kv" in str(s.labels) or "kv" in s.name)]
        tail = (self.d / "router.log").read_text(errors="replace")[-2000:]
        return f"(up: {self.health()[engine]['up']}; {seen}; router log: {tail})"

    def stock_metrics(self) -> VllmMetrics:
        """The stock engine's own /metrics (the truth the router's view is tested against;
        on 2 busy cores the router may scrape less often than its interval)."""
        return parse_metrics(httpx.get(self.urls["stock"] + "/metrics", timeout=10).content)

    def admin(self, engine: str, state: str) -> None:
        r = httpx.post(f"{self.router}/admin/engines/{engine}/{state}?reason=test",
                       timeout=10)
        assert r.status_code == 200, r.text

    def complete(self, prompt: str | list[int], max_tokens: int, url: str | None = None,
                 **body: Any) -> httpx.Response:
        return httpx.post((url or self.router) + "/v1/completions", timeout=300, json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **body})


def _spawn(argv: list[str], log: Path, core: str) -> subprocess.Popen[bytes]:
    return spawn(argv, log, {"VLLM_CPU_OMP_THREADS_BIND": core})


def _spawn_stock(d: Path, port: int) -> subprocess.Popen[bytes]:
    """Unmodified vLLM, as an operator runs it (no hetserve module on its command line), in
    its dev mode (``VLLM_SERVER_DEV_MODE``: ``/pause``, ``/resume``) on core 0."""
    return spawn(_stock_argv(d, port), d / "stock.log",
                 {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_SERVER_DEV_MODE": "1",
                  "VLLM_ENABLE_RESPONSES_API_STORE": "1"})


def _stock_argv(d: Path, port: int) -> list[str]:
    return [str(Path(sys.executable).parent / "vllm"), "serve",
            resolve_model(f"builtin:{MODEL}"), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port), "--enable-prefix-caching",
            "--scheduling-policy", "priority", "--max-num-seqs", str(MAX_NUM_SEQS),
            "--kv-events-config", json.dumps({
                "enable_kv_cache_events": True, "publisher": "zmq",
                "endpoint": f"ipc://{d}/stock.kv", "topic": "stock-0"}),
            "--enable-server-load-tracking", "--enable-log-requests", *TINY_ENGINE_ARGS]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    wait_healthy(url, proc, log, HEALTH_TIMEOUT_S)


def _until(check: Callable[[], bool], timeout_s: float,
           why: Callable[[], str] = lambda: "") -> float:
    """Seconds until ``check`` held (fails the test past ``timeout_s``, saying ``why()``)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s {why()}"
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    d = Path(tempfile.mkdtemp(prefix="hs-stock-", dir="/tmp"))  # short: ipc paths
    ports = {"stock": free_port(), "patched": free_port(), "router": free_port()}
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["stock"] = _spawn_stock(d, ports["stock"])
        procs["patched"] = _spawn([
            sys.executable, "-m", "engine_ext.serve", "--model", f"builtin:{MODEL}",
            "--engine-id", "patched-0", "--served-model-name", MODEL,
            "--telemetry-endpoint", f"ipc://{d}/patched.t",
            "--kv-events-endpoint", f"ipc://{d}/patched.kv", "--port", str(ports["patched"]),
            "--max-num-seqs", "8", *TINY_ENGINE_ARGS], d / "patched.log", "1")
        for name in ("stock", "patched"):
            _wait_healthy(urls[name], procs[name], d / f"{name}.log")
        (d / "cluster.toml").write_text(f"""
[router]
policy = "dynamo"
port = {ports["router"]}
allow_client_priority = true
scrape_interval_ms = {SCRAPE_INTERVAL_MS}
scrape_timeout_s = {SCRAPE_TIMEOUT_S}
breaker_backoff_s = 0.5

[[engines]]
name = "stock-0"
kind = "vllm"
sched_policy = "priority"
model = "builtin:{MODEL}"
served_model_name = "{MODEL}"
url = "{urls["stock"]}"
kv_events_endpoint = "ipc://{d}/stock.kv"

[[engines]]
name = "patched-0"
model = "builtin:{MODEL}"
served_model_name = "{MODEL}"
url = "{urls["patched"]}"
telemetry_endpoint = "ipc://{d}/patched.t"
kv_events_endpoint = "ipc://{d}/patched.kv"
""")
        procs["router"] = _spawn([sys.executable, "-m", "router", "--config",
                                  str(d / "cluster.toml")], d / "router.log", "0-1")
        _wait_healthy(urls["router"], procs["router"], d / "router.log")
        yield Cluster(d, urls["router"], urls, procs)
    finally:
        for proc in procs.values():
            kill_group(proc)
        shutil.rmtree(d, ignore_errors=True)


def test_health_metrics_and_table_say_each_engines_kind(cluster: Cluster) -> None:
    health = cluster.health()
    assert {n: (i["kind"], i["up"]) for n, i in health.items()} == {
        "stock-0": ("vllm", True), "patched-0": ("hetserve", True)}
    text = httpx.get(cluster.router + "/metrics", timeout=10).text
    info = {s.labels["engine"]: s.labels["kind"] for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "hetserve_engine_info"}
    assert info == {"stock-0": "vllm", "patched-0": "hetserve"}
    assert (cluster.gauge("hetserve_scrapes_total", "stock-0") or 0) > 0


def test_load_on_the_stock_engine_is_read_from_its_metrics(cluster: Cluster) -> None:
    """Requests sent straight to the stock engine (the router never saw them) show in the
    router's view of it, running and waiting (max_num_seqs 1: four clients sending
    ``LOAD_TOKENS``-token requests back to back, until the router saw both or
    ``LOAD_TIMEOUT_S`` passed; then the clients leave and vLLM aborts their requests,
    rather than the test waiting out four 900-token answers). The time to each is
    printed. Not exact counts at set times (the router's view lags the engine by a scrape
    at least); exact readings of a real body: tests/unit/test_scraper.py.

    Why these sizes: vLLM's API server answers /metrics only when its event loop is free
    of its output handler, which on 2 busy cores is when the engine has nothing to send:
    with 300-token answers (0.9 s each here) every reading of a direct probe said 0
    running, 0 waiting for 20 s, and CI's run of 2026-12-07 saw no waiting request in
    180 s; with 900-token answers (3 s each) every reading said 1 running, 3 waiting
    (``vllm:num_requests_*``, 30 readings, 2026-12-07). Whole answers, not streams: a
    streaming API server answered /metrics up to 12.7 s late."""
    start, first, codes = time.monotonic(), dict[str, float](), list[int]()

    async def client(http: httpx.AsyncClient, i: int) -> None:
        while True:
            codes.append((await http.post(
                cluster.urls["stock"] + "/v1/completions", timeout=300,
                json={"model": MODEL, "prompt": f"load {i}", "max_tokens": LOAD_TOKENS,
                      "ignore_eos": True})).status_code)

    def watch() -> None:
        while len(first) < 2 and time.monotonic() - start < LOAD_TIMEOUT_S:
            for name in ("batch_size", "num_waiting"):
                if (cluster.gauge(f"hetserve_engine_{name}", "stock-0") or 0) >= 1:
                    first.setdefault(name, time.monotonic() - start)
            time.sleep(0.05)

    async def load() -> None:
        """The clients run until the router saw the load; then they leave, and vLLM
        aborts the requests they leave (a client's disconnect aborts its request)."""
        async with httpx.AsyncClient() as http:
            clients = [asyncio.create_task(client(http, i)) for i in range(CLIENTS)]
            try:
                await asyncio.to_thread(watch)
            finally:
                for task in clients:
                    task.cancel()
                await asyncio.gather(*clients, return_exceptions=True)

    asyncio.run(load())
    assert all(code == 200 for code in codes), codes  # those that ended before
    assert set(first) == {"batch_size", "num_waiting"}, (
        first, cluster.scrapes("stock-0"), "the engine's own /metrics after the load:",
        cluster.stock_metrics())
    print("router saw them running, waiting after "
          + ", ".join(f"{v:.2f} s" for v in first.values()))
    _until(lambda: cluster.stock_metrics()[:2] == (0, 0), 60)


def _prompt(seed: int) -> list[int]:
    return random.Random(seed).choices(range(100, 400), k=600)  # 4 full 128-token blocks


@pytest.mark.parametrize("holder", ["stock-0", "patched-0"])
def test_a_repeated_long_prompt_lands_on_the_engine_holding_it(cluster: Cluster,
                                                               holder: str) -> None:
    """The prompt is first sent straight to ``holder``: the router learns its blocks from
    that engine's KV events only (vLLM's own, on the stock engine)."""
    prompt = _prompt(zlib.crc32(holder.encode()))  # stable across runs, unlike hash()
    direct = cluster.urls["stock" if holder == "stock-0" else "patched"]
    assert cluster.complete(prompt, 1, direct).status_code == 200
    _until(lambda: (cluster.gauge("hetserve_engine_kv_index_blocks", holder) or 0) >= 4,
           KV_EVENT_TIMEOUT_S, lambda: cluster.kv_diagnosis(holder))
    for _ in range(3):
        r = cluster.complete(prompt, 1)
        assert r.status_code == 200 and r.headers["x-hetserve-engine"] == holder


def test_priorities_reach_the_stock_priority_scheduler(cluster: Cluster) -> None:
    """With the patched engine out of routing and the stock engine paused (vLLM's
    ``/pause?mode=keep``: its scheduler takes requests in and does not step), three
    low-priority requests and then a high-priority one go through the router. Its API
    server logs "Added request" once it has sent a request to its engine core; ``/resume``
    reaches the core over the same socket, after them, so all four wait in the scheduler
    when it starts (its ``/load``, requests in its handlers, is no such sign: a run that
    resumed 1 s after ``/load`` counted four saw the high one served last). With one slot
    (``MAX_NUM_SEQS``) the order they finish in is the order it served them: the high one,
    sent last, first (its 20 tokens end about 1 s before the first low one's 300 here, so
    a router or API server slowed by a busy machine does not reorder the answers). The
    pause lasts seconds, far from the router's scheduler stall timeout (30 s)."""
    stock, log = cluster.urls["stock"], cluster.d / "stock.log"
    done: list[str] = []

    def send(tag: str, priority: int, max_tokens: int) -> httpx.Response:
        r = cluster.complete(f"priority {tag}", max_tokens, priority=priority)
        done.append(tag)
        return r

    def load() -> int:
        return httpx.get(stock + "/load", timeout=10).json()["server_load"]

    def added() -> int:
        """Requests the stock engine sent to its core since the pause."""
        with log.open("rb") as f:
            f.seek(mark)
            return f.read().count(b"Added request")

    def why() -> str:
        return f"(load {load()}; added since the pause {added()}; finished: {done})"

    mark = log.stat().st_size
    _until(lambda: load() == 0, 60, why)
    cluster.admin("patched-0", "down")
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            httpx.post(stock + "/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
            mark = log.stat().st_size
            try:
                jobs = [pool.submit(send, f"low{i}", 10, 300) for i in range(3)]
                _until(lambda: added() == 3, ARRIVAL_TIMEOUT_S, why)
                jobs.append(pool.submit(send, "high", 1, 20))  # 1: the best (0 is none)
                _until(lambda: added() == 4, ARRIVAL_TIMEOUT_S, why)
            finally:
                httpx.post(stock + "/resume", timeout=30).raise_for_status()
            responses = [j.result() for j in jobs]
        assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
        assert {r.headers["x-hetserve-engine"] for r in responses} == {"stock-0"}
        assert responses[-1].headers["x-hetserve-priority"] == "1"
        print("finished in order:", done)
        assert done[0] == "high", done
        unranked = cluster.complete("priority none", 4)  # no prediction: last, as STJF
        assert unranked.headers["x-hetserve-priority"] == str(PRIORITY_MAX), unranked.text
    finally:
        cluster.admin("patched-0", "up")


def test_vllm_bench_serve_through_the_router(cluster: Cluster) -> None:
    """vLLM's own benchmark client against the router over both engines: no failure."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "vllm"), "bench", "serve",
         "--backend", "openai", "--base-url", cluster.router, "--model", MODEL,
         "--tokenizer", resolve_model(f"builtin:{MODEL}"), "--dataset-name", "random",
         "--random-input-len", "64", "--random-output-len", "16", "--num-prompts", "24",
         "--request-rate", "12", "--seed", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Successful requests:                     24" in out.stdout, out.stdout[-2000:]
    assert "Failed requests:                         0" in out.stdout, out.stdout[-2000:]


def test_the_agents_apis_reach_the_stock_engine(cluster: Cluster) -> None:
    """Responses (a ``previous_response_id`` chain), Messages (its priority in vLLM's
    header, which the stock priority scheduler reads) and ``count_tokens`` through the
    router to the stock engine (the patched one marked down meanwhile)."""
    cluster.admin("patched-0", "down")
    try:
        first = httpx.post(cluster.router + "/v1/responses", timeout=120, json={
            "model": MODEL, "input": "Say hi", "max_output_tokens": 4})
        assert first.status_code == 200, first.text
        assert first.headers["x-hetserve-engine"] == "stock-0"
        chained = httpx.post(cluster.router + "/v1/responses", timeout=120, json={
            "model": MODEL, "input": "Again", "max_output_tokens": 4,
            "previous_response_id": first.json()["id"]})
        assert chained.status_code == 200, chained.text
        assert chained.headers["x-hetserve-engine"] == "stock-0"  # where it was stored
        assert chained.json()["previous_response_id"] == first.json()["id"]
        message = httpx.post(cluster.router + "/v1/messages", timeout=120, json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert message.status_code == 200, message.text
        assert message.headers["x-hetserve-engine"] == "stock-0"
        assert message.json()["type"] == "message"
        count = httpx.post(cluster.router + "/v1/messages/count_tokens", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert count.status_code == 200 and count.json()["input_tokens"] > 0, count.text
        assert count.headers["x-hetserve-engine"] == "stock-0"
    finally:
        cluster.admin("patched-0", "up")


def test_the_stock_engine_killed_and_started_again(cluster: Cluster) -> None:
    """SIGKILL: requests keep succeeding (re-dispatched to the patched engine), the stock
    engine is down within the scrape timeout; started again on its port, its scrapes
    bring it back and it serves again."""
    kill_group(cluster.procs["stock"], signal.SIGKILL)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda i: cluster.complete(f"during {i}", 4).status_code,
                              range(12)))
    assert codes == [200] * 12
    _until(lambda: not cluster.health()["stock-0"]["up"], SCRAPE_TIMEOUT_S + 5)
    port = int(cluster.urls["stock"].rsplit(":", 1)[1])
    cluster.procs["stock"] = _spawn_stock(cluster.d, port)
    _wait_healthy(cluster.urls["stock"], cluster.procs["stock"], cluster.d / "stock.log")
    _until(lambda: cluster.health()["stock-0"]["up"], 30)
    cluster.admin("patched-0", "down")
    try:
        r = cluster.complete("after the restart", 4)
        assert r.status_code == 200 and r.headers["x-hetserve-engine"] == "stock-0"
    finally:
        cluster.admin("patched-0", "up")
