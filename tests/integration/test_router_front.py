"""The router's HTTP front against two real engines (built-in tiny models).

One module-scoped cluster: the package's engines ``a-0`` (``tiny-a``) and ``b-0`` (``tiny-b``,
tests/tiny_pair.py, ``python -m engine_ext.serve``), and the router started with ``python -m
router`` on TCP and a unix socket. The tests run in file order; the engine failure test
kills engine ``b-0``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine_proc import free_port, kill_group, spawn, wait_healthy
from tests.tiny_pair import ENGINE_KEY, ENGINES, MAX_MODEL_LEN, TinyPair

pytestmark = pytest.mark.engine

ROUTER_HEALTH_TIMEOUT_S = 90.0
HETSERVE_HEADERS = ("x-hetserve-model", "x-hetserve-engine", "x-hetserve-policy",
                    "x-hetserve-predicted-remaining-tokens", "x-hetserve-priority")
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime number."}]


@dataclass
class Cluster:
    url: str
    uds: str
    engine_urls: dict[str, str]
    engines: dict[str, subprocess.Popen[bytes]]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def engine_metric(self, name: str, engine: str) -> float:
        return next(v for (n, labels), v in self.metrics().items()
                    if n == name and ("engine", engine) in labels)


@pytest.fixture(scope="module")
def cluster(tiny_pair: TinyPair) -> Iterator[Cluster]:
    tiny_pair.revive()
    d = tiny_pair.d
    router: subprocess.Popen[bytes] | None = None
    try:
        router_port = free_port()
        (d / "cluster.toml").write_text("\n".join([
            "[router]", 'policy = "round_robin"', 'host = "127.0.0.1"',
            f"port = {router_port}", f'uds = "{d}/router.sock"', "", tiny_pair.engines_toml()]))
        router = spawn([sys.executable, "-m", "router", "--config", str(d / "cluster.toml")],
                        d / "router.log", {ENGINE_KEY[0]: ENGINE_KEY[1]})
        url = f"http://127.0.0.1:{router_port}"
        wait_healthy(url, router, d / "router.log", ROUTER_HEALTH_TIMEOUT_S)
        yield Cluster(url, str(d / "router.sock"),
                      {name: tiny_pair.url(name) for name in ENGINES}, tiny_pair.procs)
    finally:
        if router:
            kill_group(router)


def _eventually(check: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Whether ``check`` held within ``timeout_s`` (a deadline, not a speed claim)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


# ---------------------------------------------------------------- OpenAI client


def test_engine_b_requires_its_key(cluster: Cluster) -> None:
    """vLLM's own check: without the key engine b answers 401, so the other tests that
    reach b through the router show the router sends it."""
    url = cluster.engine_urls["b"]
    assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(url + "/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {ENGINE_KEY[1]}"}).status_code == 200


def test_models_lists_every_served_model_and_auto(cluster: Cluster) -> None:
    models = {m.id for m in cluster.client().models.list()}
    assert models == {"tiny-a", "tiny-b", "auto"}


@pytest.mark.parametrize("model, engine", [("tiny-a", "a-0"), ("tiny-b", "b-0")])
def test_chat_named_model(cluster: Cluster, model: str, engine: str) -> None:
    raw = cluster.client().chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True})
    for header in HETSERVE_HEADERS:
        assert header in raw.headers, header
    assert raw.headers["x-hetserve-model"] == model
    assert raw.headers["x-hetserve-engine"] == engine
    assert raw.headers["x-hetserve-policy"] == "round_robin"
    reply = raw.parse()
    assert reply.model == model and reply.usage.completion_tokens == 8
    assert reply.choices[0].message.content


def test_chat_auto_spreads_over_models(cluster: Cluster) -> None:
    seen = set()
    for _ in range(4):
        raw = cluster.client().chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES, max_tokens=4)
        assert raw.parse().model == raw.headers["x-hetserve-model"]
        seen.add(raw.headers["x-hetserve-engine"])
    assert seen == {"a-0", "b-0"}


@pytest.mark.parametrize("model", ["tiny-a", "auto"])
def test_completions(cluster: Cluster, model: str) -> None:
    raw = cluster.client().completions.with_raw_response.create(
        model=model, prompt="def fibonacci(n):", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True})
    reply = raw.parse()
    assert reply.model == raw.headers["x-hetserve-model"]
    assert reply.usage.completion_tokens == 6 and reply.choices[0].text


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_streaming(cluster: Cluster, include_usage: bool) -> None:
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(cluster.client().chat.completions.create(
        model="tiny-a", messages=MESSAGES, max_tokens=12, stream=True,
        extra_body={"ignore_eos": True}, **options))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text and finish[-1] == "length"
    usage = [c.usage for c in chunks if c.usage is not None]
    assert [u.completion_tokens for u in usage] == ([12] if include_usage else [])


def test_completions_streaming_auto(cluster: Cluster) -> None:
    stream = cluster.client().completions.create(model="auto", prompt="import os\n",
                                                 max_tokens=10, stream=True,
                                                 extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) >= 5
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stream_arrives_incrementally(cluster: Cluster) -> None:
    """Events reach the client while the engine is still generating."""
    body = {"model": "tiny-b", "messages": MESSAGES, "max_tokens": 300, "stream": True,
            "ignore_eos": True}
    arrivals = []
    with httpx.stream("POST", cluster.url + "/v1/chat/completions", json=body,
                      timeout=120) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic())
    # vLLM merges tokens into one event when the consumer lags (a busy machine: CI saw
    # 280 events for 300 tokens), so incremental means many events spread over time
    assert len(arrivals) >= 30
    assert arrivals[len(arrivals) // 2] - arrivals[0] > 0.05


def test_workflow_metadata_body_and_headers(cluster: Cluster) -> None:
    """Metadata in the body, then in headers, reaches the decision: the program table
    holds ``prog-1`` after its first stage and lets it go after its final one."""
    client = cluster.client()

    def programs() -> float:
        return cluster.metrics()[("hetserve_programs", ())]

    def served(raw: Any) -> None:
        reply, model = raw.parse(), raw.headers["x-hetserve-model"]
        assert raw.http_response.status_code == 200
        assert (raw.headers["x-hetserve-engine"], raw.headers["x-hetserve-policy"]) == (
            {"tiny-a": "a-0", "tiny-b": "b-0"}[model], "round_robin")
        assert reply.model == model and reply.usage.completion_tokens == 3
        assert [c.finish_reason for c in reply.choices] == ["length"]
        assert reply.choices[0].message.content

    before = programs()
    served(client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, max_tokens=3,
        extra_body={"ignore_eos": True,
                    "workflow": {"program_id": "prog-1", "workflow": "qa", "stage": "plan",
                                 "stage_index": 0, "num_stages": 2, "budget": 1.5,
                                 "weights": {"quality": 1.0}, "attempt": 1,
                                 "tried_models": []}}))
    assert _eventually(lambda: programs() == before + 1), (programs(), before)
    served(client.chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES, max_tokens=3, extra_body={"ignore_eos": True},
        extra_headers={"X-Hetserve-Program-Id": "prog-1", "X-Hetserve-Stage-Index": "1",
                       "X-Hetserve-Num-Stages": "2", "X-Hetserve-Final": "true",
                       "X-Hetserve-Attempt": "2", "X-Hetserve-Tried-Models": "tiny-a"}))
    assert _eventually(lambda: programs() == before), (programs(), before)


def test_client_priority_is_not_forwarded(cluster: Cluster) -> None:
    """Not allowed by this config: the body's priority is dropped, the engine accepts."""
    resp = httpx.post(cluster.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-a", "messages": MESSAGES, "max_tokens": 2, "priority": -5})
    assert resp.status_code == 200 and resp.headers["x-hetserve-priority"] == "none"


def test_per_model_max_tokens_follow_the_chosen_model(cluster: Cluster) -> None:
    """The engine generates the length given for the model the router picked; per-model
    priorities are dropped when the config does not allow client priorities."""
    lengths = {"tiny-a": 3, "tiny-b": 7}
    seen = set()
    for _ in range(4):
        resp = httpx.post(cluster.url + "/v1/chat/completions", timeout=60, json={
            "model": "auto", "messages": MESSAGES, "max_tokens": 7, "ignore_eos": True,
            "per_model": {"max_tokens": lengths, "priority": {"tiny-a": 1, "tiny-b": 2}}})
        assert resp.status_code == 200, resp.text
        model = resp.headers["x-hetserve-model"]
        assert resp.json()["usage"]["completion_tokens"] == lengths[model]
        assert resp.headers["x-hetserve-priority"] == "none"
        seen.add(model)
    assert seen == set(lengths)  # round robin: both models served


# ---------------------------------------------------------------- bad input

CHAT_OK: dict[str, Any] = {"model": "tiny-a", "messages": MESSAGES}
BAD_INPUT = [
    # (path, body bytes or JSON, headers, status, code, words in the message)
    ("/v1/chat/completions", b'{"model": "tiny-a", "messages": [', {}, 400, "invalid_json",
     "not valid JSON"),
    ("/v1/chat/completions", {**CHAT_OK, "model": "gpt-9"}, {}, 404, "model_not_found",
     "model 'gpt-9' does not exist"),
    ("/v1/chat/completions", {"model": "tiny-a"}, {}, 400, "missing_field",
     "'messages' is required"),
    ("/v1/completions", {"model": "tiny-a"}, {}, 400, "missing_field", "'prompt' is required"),
    ("/v1/chat/completions", {**CHAT_OK, "max_tokens": 2000}, {}, 400,
     "context_length_exceeded", "has a context of 1024 tokens"),
    ("/v1/completions", {"model": "auto", "prompt": "x", "max_tokens": 1024}, {}, 400,
     "context_length_exceeded", "lower max_tokens to at most 1023"),
    ("/v1/chat/completions", {**CHAT_OK, "workflow": {"stage_index": "first"}}, {}, 400,
     "invalid_type", "'workflow.stage_index' must be an integer"),
    ("/v1/chat/completions", {**CHAT_OK, "workflow": "prog-1"}, {}, 400, "invalid_type",
     "'workflow' must be an object"),
    ("/v1/chat/completions", CHAT_OK, {"X-Hetserve-Num-Stages": "many"}, 400, "invalid_type",
     "'X-Hetserve-Num-Stages' must be an integer"),
    ("/v1/chat/completions", {**CHAT_OK, "max_tokens": "8"}, {}, 400, "invalid_type",
     "'max_tokens' must be an integer"),
    ("/v1/chat/completions", {**CHAT_OK, "per_model": {"max_tokens": {"tiny-z": 3}}}, {},
     400, "model_not_found", "'per_model.max_tokens' names model 'tiny-z'"),
    ("/v1/chat/completions", {**CHAT_OK, "per_model": {"max_tokens": {"tiny-a": 0}}}, {},
     400, "invalid_value", "'per_model.max_tokens.tiny-a' must be >= 1"),
]


@pytest.mark.parametrize("path, body, headers, status, code, words", BAD_INPUT)
def test_bad_input(cluster: Cluster, path: str, body: Any, headers: dict[str, str],
                   status: int, code: str, words: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = httpx.post(cluster.url + path, content=content, timeout=30,
                      headers={"content-type": "application/json", **headers})
    error = resp.json()["error"]
    assert (resp.status_code, error["code"]) == (status, code), error
    assert words in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_bad_input_through_openai_client(cluster: Cluster) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        cluster.client().chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="has a context of 1024 tokens"):
        cluster.client().chat.completions.create(model="tiny-b", messages=MESSAGES,
                                                 max_tokens=5000)


def test_round_robin_tokenizes_only_prompts_that_may_not_fit(cluster: Cluster) -> None:
    """Round robin reads no prompt: a short one is forwarded untokenized (its byte bound
    fits), an over-long one is tokenized and refused before any engine sees it."""
    tokenized = ("hetserve_tokenize_latency_seconds_count", ())
    before = cluster.metrics()[tokenized]
    reply = cluster.client().chat.completions.create(model="tiny-a", messages=MESSAGES,
                                                     max_tokens=4)
    assert reply.usage.prompt_tokens > 0 and cluster.metrics()[tokenized] == before
    resp = httpx.post(cluster.url + "/v1/chat/completions", timeout=30, json={
        "model": "tiny-a", "max_tokens": 4,
        "messages": [{"role": "user", "content": "x " * (2 * MAX_MODEL_LEN)}]})
    error = resp.json()["error"]
    assert (resp.status_code, error["code"]) == (400, "context_length_exceeded"), error
    assert f"has a context of {MAX_MODEL_LEN} tokens" in error["message"]
    assert cluster.metrics()[tokenized] == before + 1


NASTY = [
    # bodies that reach the tokenizer or the engine with odd but well-typed values
    ("/v1/completions", {"model": "tiny-a", "prompt": [10**9], "max_tokens": 2}),
    ("/v1/completions", {"model": "auto", "prompt": "\ud800 lone surrogate", "max_tokens": 2}),
    ("/v1/chat/completions", {**CHAT_OK, "chat_template_kwargs": {"tokenize": True}}),
    ("/v1/chat/completions", {**CHAT_OK, "chat_template_kwargs": {"messages": 1}}),
    ("/v1/chat/completions", {**CHAT_OK, "tools": "not a list", "max_tokens": 2}),
    ("/v1/chat/completions", {**CHAT_OK, "add_generation_prompt": [], "max_tokens": 2}),
    ("/v1/chat/completions", {**CHAT_OK, "messages": [{"role": "x" * 10_000,
                                                       "content": "y" * 100_000}]}),
]


@pytest.mark.parametrize("path, body", NASTY)
def test_nasty_input_never_fails_the_router(cluster: Cluster, path: str, body: Any) -> None:
    resp = httpx.post(cluster.url + path, content=json.dumps(body).encode(), timeout=60,
                      headers={"content-type": "application/json"})
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        assert resp.json()["error"]["message"]
    assert httpx.get(cluster.url + "/health", timeout=10).status_code == 200


def test_engine_validation_errors_pass_through(cluster: Cluster) -> None:
    resp = httpx.post(cluster.url + "/v1/chat/completions", timeout=30,
                      json={**CHAT_OK, "temperature": -1})
    assert resp.status_code == 400 and "temperature" in resp.json()["error"]["message"]


# ---------------------------------------------------------------- health, metrics, admin


def test_health(cluster: Cluster) -> None:
    resp = httpx.get(cluster.url + "/health", timeout=10)
    assert resp.status_code == 200 and resp.json()["engines_up"] == 2


FAMILIES = {
    "hetserve_engine_up", "hetserve_engine_batch_size", "hetserve_engine_num_waiting",
    "hetserve_engine_queued_prefill_tokens", "hetserve_engine_pending_decode_tokens",
    "hetserve_engine_kv_usage", "hetserve_engine_inflight_requests",
    "hetserve_engine_inflight_predicted_tokens", "hetserve_telemetry_staleness_seconds",
    "hetserve_telemetry_frames", "hetserve_telemetry_lost_frames",
    "hetserve_telemetry_dropped_frames", "hetserve_decisions",
    "hetserve_decision_latency_seconds", "hetserve_predictor_latency_seconds",
    "hetserve_requests", "hetserve_upstream_errors", "hetserve_tokenize_latency_seconds",
}


def test_metrics_parse_and_hold_every_family(cluster: Cluster) -> None:
    text = httpx.get(cluster.url + "/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert FAMILIES <= set(families)
    metrics = cluster.metrics()
    assert metrics[("hetserve_engine_up", (("engine", "a-0"), ("model", "tiny-a")))] == 1
    decisions = {labels: v for (n, labels), v in metrics.items()
                 if n == "hetserve_decisions_total"}
    assert decisions[(("model", "tiny-b"), ("policy", "round_robin"))] >= 1
    assert metrics[("hetserve_decision_latency_seconds_count",
                    (("policy", "round_robin"),))] >= 1
    # an idle engine's heartbeats (every 0.5 s) keep resetting it: polled, not timed
    assert _eventually(
        lambda: cluster.engine_metric("hetserve_telemetry_staleness_seconds", "a-0") < 1.0)


def test_unix_socket_and_admin_down_up(cluster: Cluster) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=cluster.uds), base_url="http://router",
                      timeout=60) as uds:
        assert uds.get("/health").status_code == 200
        answer = uds.post("/admin/engines/b-0/down").json()
        counter, worker = answer.pop("version")  # a lone router is worker 0
        assert answer == {"instance": "b-0", "up": False, "reason": "admin"}
        assert counter >= 1 and worker == 0
        engines = {uds.post("/v1/completions", json={"model": "auto", "prompt": "x",
                                                      "max_tokens": 2}
                            ).headers["x-hetserve-engine"] for _ in range(3)}
        assert engines == {"a-0"}
        resp = uds.post("/v1/completions", json={"model": "tiny-b", "prompt": "x",
                                                 "max_tokens": 2})
        assert resp.status_code == 503 and "no engine" in resp.json()["error"]["message"]
        assert uds.post("/admin/engines/nope/down").status_code == 404
        assert uds.post("/admin/engines/b-0/up").json()["up"] is True
    resp = httpx.post(cluster.url + "/v1/completions", timeout=60,
                      json={"model": "tiny-b", "prompt": "x", "max_tokens": 2})
    assert resp.status_code == 200 and resp.headers["x-hetserve-engine"] == "b-0"


def _engine_counter(cluster: Cluster, engine: str, name: str) -> float:
    text = httpx.get(cluster.engine_urls[engine] + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == name)


@contextmanager
def _frozen(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Hold an engine still (SIGSTOP to its process group) while the test reads the router:
    a generating CPU engine starves every other process on two cores (its engine core
    busy-waits beside the worker), so a scrape can take as long as the generation."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):  # killed while frozen
            os.killpg(proc.pid, signal.SIGCONT)


def test_client_disconnect_mid_stream_aborts_and_releases(cluster: Cluster) -> None:
    """tiny-b needs seconds for 900 tokens: the disconnect lands mid-generation."""
    generated = "vllm:generation_tokens_total"
    before = _engine_counter(cluster, "b", generated)
    body = {"model": "tiny-b", "messages": MESSAGES, "max_tokens": 900, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", cluster.url + "/v1/chat/completions", json=body,
                      timeout=60) as resp:
        lines = resp.iter_lines()
        for _ in range(3):
            next(lines)
        with _frozen(cluster.engines["b"]):
            assert cluster.engine_metric("hetserve_engine_inflight_requests", "b-0") == 1
            resp.close()  # the disconnect: b sees it as it resumes
    assert _eventually(
        lambda: cluster.engine_metric("hetserve_engine_inflight_requests", "b-0") == 0)
    assert _eventually(lambda: _engine_counter(cluster, "b", "vllm:num_requests_running") == 0)
    assert _engine_counter(cluster, "b", generated) - before < 900  # aborted, not finished


# ---------------------------------------------------------------- engine failure (last)


def test_killed_engine_is_routed_around_and_released(cluster: Cluster) -> None:
    """Kill b-0 while it streams: the stream ends with an error, b-0's in-flight
    accounting is released, it is marked down, and later requests go to a-0."""
    client = cluster.client()
    errors: list[BaseException] = []
    streaming = threading.Semaphore(0)

    def stream() -> None:
        first = True
        try:
            for _ in client.chat.completions.create(
                    model="tiny-b", messages=MESSAGES, max_tokens=900, stream=True,
                    extra_body={"ignore_eos": True}):
                if first:
                    first = False
                    streaming.release()
        except Exception as exc:  # the error event the router sends (checked below)
            errors.append(exc)
        finally:
            if first:
                streaming.release()

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    assert all(streaming.acquire(timeout=60) for _ in threads)
    with _frozen(cluster.engines["b"]):
        assert not errors, errors
        assert cluster.engine_metric("hetserve_engine_inflight_requests", "b-0") == 2
        os.killpg(cluster.engines["b"].pid, signal.SIGKILL)
    cluster.engines["b"].wait(30)
    for t in threads:
        t.join(60)
    # the router's OpenAI error event (not a broken connection: openai.APIConnectionError)
    assert [type(e) for e in errors] == [openai.APIError] * 2, errors
    for e in errors:
        assert (e.type, e.code) == ("upstream_error", "upstream_protocol"), e.body
        assert "engine 'b-0' broke the connection" in e.message, e.message
    assert _eventually(lambda: cluster.engine_metric("hetserve_engine_up", "b-0") == 0)
    assert cluster.engine_metric("hetserve_engine_inflight_requests", "b-0") == 0
    assert cluster.engine_metric("hetserve_engine_inflight_predicted_tokens", "b-0") == 0
    upstream_errors = sum(v for (n, labels), v in cluster.metrics().items()
                          if n == "hetserve_upstream_errors_total" and ("engine", "b-0") in labels)
    assert upstream_errors >= 2
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(model="auto",
                                                               messages=MESSAGES, max_tokens=3)
        assert raw.headers["x-hetserve-engine"] == "a-0"
    with pytest.raises(openai.InternalServerError, match="no engine"):
        client.chat.completions.create(model="tiny-b", messages=MESSAGES, max_tokens=3)
    assert httpx.get(cluster.url + "/health", timeout=10).json()["engines_up"] == 1

    # Marked up while still dead: the request that picks it is routed again.
    with httpx.Client(transport=httpx.HTTPTransport(uds=cluster.uds), base_url="http://router",
                      timeout=60) as uds:
        assert uds.post("/admin/engines/b-0/up").status_code == 200
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(model="auto",
                                                               messages=MESSAGES, max_tokens=3)
        assert raw.headers["x-hetserve-engine"] == "a-0"
    connect_errors = cluster.metrics()[("hetserve_upstream_errors_total",
                                        (("engine", "b-0"), ("kind", "connect")))]
    assert connect_errors == 1
    assert cluster.engine_metric("hetserve_engine_up", "b-0") == 0
    assert cluster.engine_metric("hetserve_engine_inflight_requests", "a-0") == 0


# ---------------------------------------------------------------- vLLM's own load generator


@pytest.mark.parametrize("model", ["tiny-a", "auto"])
def test_vllm_bench_serve_through_the_router(cluster: Cluster, model: str,
                                             tmp_path: Path) -> None:
    """`vllm bench serve` (streamed completions, random prompts) from the project's .venv
    runs through the router and every request succeeds."""
    from engine_ext.builtin_models import resolve_model

    vllm = Path(sys.executable).with_name("vllm")
    proc = subprocess.run(
        [str(vllm), "bench", "serve", "--backend", "vllm", "--base-url", cluster.url,
         "--endpoint", "/v1/completions", "--model", model,
         "--tokenizer", resolve_model("builtin:tiny-a"), "--dataset-name", "random",
         "--random-input-len", "32", "--random-output-len", "8", "--ignore-eos",
         "--num-prompts", "12", "--max-concurrency", "4", "--ready-check-timeout-sec", "0",
         "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
         "--result-filename", "bench.json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 12 and result.get("failed", 0) == 0, result
    assert result["total_output_tokens"] == 12 * 8
