"""The router's CPU cost of scraping stock vLLM engines' ``/metrics``, per engine.

Measured: a real ``RouterCore`` (round_robin) in this process, on uvloop as the router
runs, over N ``kind = "vllm"`` engines that are stand-ins (``kernels_bench.scrape.standin``,
another process, so their CPU is not counted) serving a real vLLM ``/metrics`` body on
loopback. Its scraper (``router.dispatch.scraper``) is switched on and off in turns on the
same core, and this process's CPU time (``getrusage``: every thread) is read over a window
of W seconds in each state, in alternating order (on-off, off-on, ...) after a settling
pause. A round's cost is (on - off) CPU / wall time / N, as % of one core per engine, with
a t interval over the rounds; the scrapes done in the on windows are counted against
W / interval per engine, so a scraper that falls behind cannot look cheap.

Modelled (timeit, not in the loop): ``parse_metrics`` alone on the body, and the same body
through ``prometheus_client``'s full parser, the reference a generic parser would cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
import timeit
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean, stdev
from typing import Any, Callable

import uvloop
from prometheus_client.parser import text_string_to_metric_families
from scipy import stats

from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import RemoteEngine
from router.dispatch.core import RouterCore
from router.state.vllm_metrics import parse_metrics

ROOT = Path(__file__).resolve().parents[2]
BODY = ROOT / "tests" / "fixtures" / "vllm_metrics.txt"
"""A real vLLM 0.32 ``/metrics`` body (50 KB, one served model)."""
TARGET_PCT = 2.0
"""The requirement: at most 2% of one core per engine at a 100 ms interval."""
SLOW = 0.9
"""A scraper achieving under this fraction of its target rate is flagged as slow."""
STANDIN_STOP_S = 10.0
"""How long the stand-ins get to exit once their stdin closes."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Window:
    """One measured window of one state (scraping on or off) of one round."""

    engines: int
    round: int
    scraping: bool
    wall_s: float
    user_s: float
    sys_s: float
    scrapes_ok: int
    scrapes_failed: int

    @property
    def cpu_frac(self) -> float:
        """CPU seconds per wall second (1.0: one core busy)."""
        return (self.user_s + self.sys_s) / self.wall_s


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def cluster(urls: list[str], interval_ms: float) -> ClusterConfig:
    """N stock engines of one model at ``urls``, routed round robin, scraped every
    ``interval_ms``."""
    return ClusterConfig(
        source="scrape-bench",
        router=RouterConfig(policy="round_robin", scrape_interval_ms=interval_ms),
        engines=[RemoteEngine(name=f"stock-{i}", served_model_name="m", kind="vllm", url=url)
                 for i, url in enumerate(urls)])


def start_standins(servers: int, body: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """The stand-in process and its ports (RuntimeError if it did not start)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernels_bench.scrape.standin", "--servers", str(servers),
         "--body", str(body)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        stop_standins(proc)
        assert proc.stderr is not None
        raise RuntimeError(f"the stand-ins did not start:\n{proc.stderr.read()[-2000:]}")
    return proc, json.loads(line)


def stop_standins(proc: subprocess.Popen[str]) -> None:
    """Close the stand-ins' stdin (they exit), kill them if they do not."""
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(STANDIN_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _window(core: RouterCore, engines: int, rnd: int, scraping: bool,
                  window_s: float) -> Window:
    scrapes = core.membership.scraper.scrapes
    ok0 = sum(c["ok"] for c in scrapes.values())
    all0 = sum(c.total() for c in scrapes.values())
    w0, (u0, s0) = time.perf_counter(), _cpu()
    await asyncio.sleep(window_s)
    (u1, s1), w1 = _cpu(), time.perf_counter()
    ok = sum(c["ok"] for c in scrapes.values()) - ok0
    failed = sum(c.total() for c in scrapes.values()) - all0 - ok
    return Window(engines, rnd, scraping, w1 - w0, u1 - u0, s1 - s0, ok, failed)


async def _measure(ports: list[int], engines: int, interval_ms: float, window_s: float,
                   rounds: int, settle_s: float, progress: Progress) -> list[Window]:
    """Alternate scraping on and off on one core of ``engines`` stand-ins."""
    core = RouterCore(cluster([f"http://127.0.0.1:{p}" for p in ports[:engines]], interval_ms))
    names = list(core.membership.instances)
    scraper = core.membership.scraper
    windows: list[Window] = []
    await core.start()  # scraping on
    on = True
    try:
        await asyncio.sleep(settle_s)
        for rnd in range(rounds):
            for scraping in (True, False) if rnd % 2 == 0 else (False, True):
                if scraping != on:
                    await (scraper.start(names) if scraping else scraper.stop())
                    on = scraping
                    await asyncio.sleep(settle_s)
                w = await _window(core, engines, rnd, scraping, window_s)
                windows.append(w)
                progress(f"  {engines} engines, round {rnd + 1}/{rounds}, scraping "
                         f"{'on ' if scraping else 'off'}: {100 * w.cpu_frac:6.2f}% of a core, "
                         f"{w.scrapes_ok} scrapes ({w.scrapes_failed} failed) in "
                         f"{w.wall_s:.2f} s")
    finally:
        await core.stop()
    return windows


def interval95(values: list[float]) -> tuple[float, float] | None:
    """The mean's 95% t interval (None with fewer than two values)."""
    if len(values) < 2:
        return None
    half = stats.t.ppf(0.975, len(values) - 1) * stdev(values) / len(values) ** 0.5
    return mean(values) - half, mean(values) + half


def summarize(windows: list[Window], interval_ms: float,
              target_pct: float = TARGET_PCT) -> list[dict[str, Any]]:
    """Per engine count: CPU % of one core per engine (mean of the rounds' on - off, 95%
    interval), CPU µs per scrape, scrapes per second per engine achieved vs target, and
    the verdict against ``target_pct``."""
    rows = []
    for n in sorted({w.engines for w in windows}):
        pairs: dict[int, dict[bool, Window]] = {}
        for w in windows:
            if w.engines == n:
                pairs.setdefault(w.round, {})[w.scraping] = w
        on = [p[True] for p in pairs.values()]
        off = [p[False] for p in pairs.values()]
        pct = [100 * (a.cpu_frac - b.cpu_frac) / n for a, b in zip(on, off)]
        us = [1e6 * (a.cpu_frac - b.cpu_frac) * a.wall_s / a.scrapes_ok
              for a, b in zip(on, off) if a.scrapes_ok]
        target_rate = 1e3 / interval_ms
        rate = sum(w.scrapes_ok for w in on) / sum(w.wall_s for w in on) / n
        ci = interval95(pct)
        hi, lo = (ci[1], ci[0]) if ci else (mean(pct), mean(pct))
        verdict = ("meets" if hi <= target_pct else "over" if lo > target_pct
                   else "unclear")
        if rate < SLOW * target_rate:
            verdict += ", slow scraper"
        rows.append({
            "engines": n, "rounds": len(pct), "cpu_pct_per_engine": mean(pct),
            "ci95": ci, "rounds_pct": pct, "cpu_us_per_scrape": mean(us) if us else None,
            "on_pct": 100 * mean(w.cpu_frac for w in on),
            "off_pct": 100 * mean(w.cpu_frac for w in off),
            "scrapes_per_s": rate, "target_per_s": target_rate,
            "failed": sum(w.scrapes_failed for w in on), "target_pct": target_pct,
            "verdict": verdict})
    return rows


def parse_costs(body: bytes, interval_ms: float) -> dict[str, float]:
    """``parse_metrics`` and ``prometheus_client``'s parser on ``body``: µs per call (the
    best of 5 timeit repeats) and what the former costs per engine at ``interval_ms``."""
    text = body.decode()
    ours = min(timeit.repeat(lambda: parse_metrics(body), number=200, repeat=5)) / 200
    full = min(timeit.repeat(lambda: list(text_string_to_metric_families(text)),
                             number=2, repeat=5)) / 2
    return {"body_bytes": len(body), "parse_metrics_us": 1e6 * ours,
            "prometheus_client_us": 1e6 * full, "ratio": full / ours,
            "parse_pct_per_engine": 100 * ours * 1e3 / interval_ms}


def run(engines: list[int], interval_ms: float = 100.0, window_s: float = 5.0,
        rounds: int = 5, body: Path = BODY, settle_s: float = 1.0,
        target_pct: float = TARGET_PCT, progress: Progress = lambda _: None) -> dict[str, Any]:
    """The benchmark: every window, the summary rows, the parse costs, the machine."""
    progress(f"starting {max(engines)} stand-ins")
    proc, ports = start_standins(max(engines), body)
    windows: list[Window] = []
    try:
        for n in engines:
            progress(f"{n} engines: {rounds} rounds of {window_s:g} s scraping on and off")
            windows += uvloop.run(_measure(ports, n, interval_ms, window_s, rounds,
                                           settle_s, progress))
    finally:
        stop_standins(proc)
    progress("parse costs (timeit)")
    return {
        "settings": {"engines": engines, "interval_ms": interval_ms, "window_s": window_s,
                     "rounds": rounds, "settle_s": settle_s, "body": body.name},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "rows": summarize(windows, interval_ms, target_pct),
        "parse": parse_costs(body.read_bytes(), interval_ms),
        "windows": [{**asdict(w), "cpu_frac": w.cpu_frac} for w in windows]}


def table(result: dict[str, Any]) -> str:
    """The printed table and the parse breakdown."""
    lines = ["| engines | CPU % of one core per engine [95% CI] | CPU µs per scrape | "
             "scrapes/s per engine (target) | verdict |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        ci = "[{:.2f}, {:.2f}]".format(*r["ci95"]) if r["ci95"] else "[n/a: 1 round]"
        us = f"{r['cpu_us_per_scrape']:.0f}" if r["cpu_us_per_scrape"] is not None else "-"
        failed = f", {r['failed']} failed" if r["failed"] else ""
        lines.append(f"| {r['engines']} | {r['cpu_pct_per_engine']:.2f} {ci} | {us} | "
                     f"{r['scrapes_per_s']:.2f} ({r['target_per_s']:g}){failed} | "
                     f"{r['verdict']} (target {r['target_pct']:g}%) |")
    p = result["parse"]
    lines.append(
        f"\nparse_metrics: {p['parse_metrics_us']:.0f} µs per call on the {p['body_bytes']:,}"
        f"-byte body ({p['parse_pct_per_engine']:.2f}% of a core per engine at "
        f"{result['settings']['interval_ms']:g} ms); prometheus_client's parser: "
        f"{p['prometheus_client_us']:,.0f} µs ({p['ratio']:.0f}x)")
    return "\n".join(lines)
