"""The front benchmark's own parts: the wrk report parser and the stand-in engine (served
on loopback in process, asked as the routers ask it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import aiohttp
import pytest

from kernels_bench.front import openloop, standin, wrk
from kernels_bench.front.wrk import WrkResult

REPORT = """Running 5s test @ http://127.0.0.1:8000/v1/chat/completions
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    15.20ms    3.10ms  60.00ms   90.00%
    Req/Sec     2.00k   100.00     2.20k    70.00%
  Latency Distribution
     50%   14.50ms
     75%   16.00ms
     90%   18.00ms
     99%    1.20s
  10000 requests in 5.00s, 3.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 100
Requests/sec:   2000.00
Transfer/sec:    600.00KB
"""


async def _until_serving(url: str) -> None:
    """Until the stand-in at ``url`` answers (it starts in this event loop's task); fails
    after 60 s saying so."""
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientConnectorError):
                async with session.get(url + "/v1/models") as r:
                    if r.status == 200:
                        return
            assert time.monotonic() < deadline, f"the stand-in at {url} did not answer in 60 s"
            await asyncio.sleep(0.05)


def test_wrk_report_parsed() -> None:
    r = wrk.parse(REPORT)
    assert (r.requests, r.seconds, r.ok_per_s) == (10000, 5.0, 1980.0)
    assert (r.p50_ms, r.p99_ms) == (14.5, 1200.0)
    assert (r.non_2xx, r.socket_errors, r.timeouts, r.errors) == (100, 2, 3, 105)
    with pytest.raises(ValueError, match="not a wrk --latency report"):
        wrk.parse("wrk: connection refused")


def test_standin_answers_chat_stream_and_models() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> None:
        server = asyncio.ensure_future(standin.serve([port], chunks=3))
        try:
            url = f"http://127.0.0.1:{port}"
            await _until_serving(url)
            async with aiohttp.ClientSession() as session:
                async with session.get(url + "/v1/models") as r:
                    assert [m["id"] for m in (await r.json())["data"]] == list(standin.SERVED)
                for _ in range(2):  # keep-alive: the same connection answers again
                    async with session.post(url + "/v1/chat/completions",
                                            json={"model": "tiny-a"}) as r:
                        assert (await r.json())["usage"]["completion_tokens"] == 8
                async with session.post(url + "/v1/chat/completions",
                                        json={"stream": True}) as r:
                    events = (await r.read()).split(b"\n\n")
                    assert r.headers["content-type"] == "text/event-stream"
                    assert events[-2] == b"data: [DONE]" and len(events) == 3 + 1 + 1 + 1
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
    asyncio.run(go())


@pytest.mark.parametrize("target", ["hetserve:round_robin/0", "hetserve:round_robin/x",
                                    "vllm-router:round_robin/2", "hetserve@base:vllm/2"])
def test_router_workers_only_for_hetserve(target: str, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    from kernels_bench.commands import front as cli

    with pytest.raises(SystemExit):
        cli.main(["--targets", target])
    assert "router workers" in capsys.readouterr().err


def test_open_loop_sends_at_its_rate_and_counts_failures() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body: dict[str, object] = {"model": "tiny-a"}

    async def go() -> tuple[WrkResult, WrkResult]:
        refused = await openloop.measure(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         body, 100, 0.2, 5)
        server = asyncio.ensure_future(standin.serve([port], chunks=3))
        try:
            await _until_serving(f"http://127.0.0.1:{port}")
            ok = await openloop.measure(f"http://127.0.0.1:{port}/v1/chat/completions",
                                        body, 200, 0.5, 5)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        return refused, ok

    refused, ok = asyncio.run(go())
    assert (refused.requests, refused.socket_errors, refused.ok_per_s) == (20, 20, 0)
    assert ok.requests == 100 and ok.errors == 0 and 0 < ok.p50_ms <= ok.p99_ms
    # Request i is sent no sooner than i / rate: the last at 99/200 s; all 100 answered.
    assert ok.seconds >= 99 / 200 and ok.ok_per_s == pytest.approx(100 / ok.seconds)


def test_added_p99_is_paired_by_repeat() -> None:
    from kernels_bench.front.bench import Cell, summarize

    cells = [Cell("direct", "open", 500, 0, 500, 1, 2.0, 0, 500),
             Cell("direct", "open", 500, 1, 500, 1, 5.0, 0, 500),
             Cell("hetserve:vllm", "open", 500, 0, 500, 2, 6.0, 0, 500),
             Cell("hetserve:vllm", "open", 500, 1, 500, 2, 6.0, 0, 500)]
    rows = {r["target"]: r for r in summarize(cells)}
    assert rows["hetserve:vllm"]["added_p99_ms"] == [2.5, 1.0, 4.0]
    assert "added_p99_ms" not in rows["direct"]


def test_paced_stream_spaces_its_events() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> tuple[float, bytes]:
        server = asyncio.ensure_future(standin.serve([port], chunks=3, interval_ms=50))
        try:
            await _until_serving(f"http://127.0.0.1:{port}")
            async with aiohttp.ClientSession() as session:
                sent = time.perf_counter()
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                        json={"stream": True}) as r:
                    body = await r.read()
                return time.perf_counter() - sent, body
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)

    lasted, body = asyncio.run(go())
    # head + 3 events + usage + [DONE], the last 4 each sent 50 ms after the one before:
    # however busy the machine, the stream cannot end sooner than 4 intervals after it began
    # (events read as they arrive could merge into one read, so they are not counted).
    events = body.split(b"\n\n")
    assert events[-2] == b"data: [DONE]" and len(events) == 3 + 1 + 1 + 1
    assert lasted >= 4 * 0.05, f"a paced stream ended {lasted * 1e3:.0f} ms after it began"


def test_the_stream_interval_is_an_option_and_bounded(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``--interval-ms`` reaches the run (it was read there before it was an option)."""
    from kernels_bench.commands import front as cli

    with pytest.raises(SystemExit):
        cli.main(["--interval-ms", "-1"])
    assert "--interval-ms: 0 to 10000" in capsys.readouterr().err
    seen: list[float] = []

    def run(args: object) -> None:
        seen.append(args.interval_ms)  # type: ignore[attr-defined]
        raise RuntimeError("stopped here")

    monkeypatch.setattr(cli, "run", run)
    with pytest.raises(SystemExit, match="stopped here"):
        cli.main(["--targets", "direct", "--interval-ms", "50"])
    assert seen == [50.0]
