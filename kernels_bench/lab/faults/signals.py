"""``python -m kernels_bench faults``: engines and the router killed and stopped under load.

Starts a cluster with the launcher (default ``examples/faults.toml``: two replicas of one
tiny model behind the router, on CPU), keeps ``--concurrency`` clients sending chat
requests in a closed loop (every other one streamed), and injects, one at a time and each
after the cluster recovered from the last:

1. ``kill-engine``: SIGKILL to one engine's server (the launcher restarts it);
2. ``stop-engine``: SIGSTOP to the other engine's server and its children (alive, port
   open, silent; the router sees its telemetry stop, the launcher finds it wedged, kills
   and restarts it);
3. ``kill-router``: SIGKILL to the router (the launcher restarts it).

Every request is counted in the phase it ended in, by what its client got: ``ok`` (a
whole answer), ``error`` (an HTTP error in OpenAI's format, or a stream that ended with an
error event: a clear error the client can retry on), ``refused`` (the connection was
refused: the router was down; clear at once), ``cut`` (the connection to the router broke
mid-request: the router process died; the client sees a transport error) or ``lost``
(nothing the client could tell from success: no answer before its timeout, or an answer
or stream that ended cleanly but incomplete, with neither ``[DONE]`` nor an error event).
A request whose connection failed before any byte of an answer came back is sent once
more on a new connection (``kernels_bench.lab.faults.resend``) and counted apart whatever its
outcome: ``resent`` when it provably never left its client (``unsent``: its pooled
keep-alive connection was found closed before its first byte was written),
``resent_unanswered`` when it was written and the connection was then reset or closed
without a response byte (``unanswered``: it may have reached the router).
The router's ``hetserve_redispatched_total`` says how many were routed again unseen. Per
engine fault, the time until the router stopped routing to the engine (its
``hetserve_engine_up`` polled every 50 ms) and until the launcher had it up again.
Loopback only, bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx
import psutil

from kernels_bench.lab.faults.resend import AnswerTracking, unanswered, unsent
from router.config.cluster import ClusterConfig, load_cluster_config

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CLUSTER = ROOT / "examples" / "faults.toml"
OUTCOMES = ("ok", "error", "refused", "cut", "lost")


@dataclass
class Record:
    """One request: when it was sent, in which phase, and what its client got."""

    sent: float
    stream: bool
    phase: str = ""
    """The phase when it ended."""
    outcome: str = "pending"
    """``pending`` until its client is done (one still pending at the end counts lost)."""
    seconds: float = 0.0
    detail: str = ""
    resent: bool = False
    """Sent again on a new connection (``resend.unsent``)."""
    resent_unanswered: bool = False
    """Sent again on a new connection (``resend.unanswered``)."""


@dataclass
class Phase:
    name: str
    fault_at: float | None = None
    down_after_s: float | None = None
    """Until the router's ``hetserve_engine_up`` for the engine read 0."""
    back_after_s: float | None = None
    """Until the launcher said the process was up again."""
    outcomes: dict[str, int] = field(default_factory=dict)
    resent: int = 0
    """Requests among them sent twice by their client (``unsent``)."""
    resent_unanswered: int = 0
    """Requests among them sent twice by their client (``unanswered``)."""
    redispatched: float = 0.0


class ClosedLoop:
    """``concurrency`` closed-loop clients (``_client``) of the router's chat endpoint, on
    an event loop in a thread of their own; a client's longest turn is ``calls_per_turn``
    requests of up to ``timeout_s`` each."""

    calls_per_turn = 1

    def __init__(self, url: str, model: str, concurrency: int, timeout_s: float) -> None:
        self.url, self.model = url + "/v1/chat/completions", model
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._fresh: aiohttp.ClientSession
        """A new connection for every request: where ``_post`` resends."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s * self.calls_per_turn + 10)

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False,
                                         connector=AnswerTracking()) as session, \
                aiohttp.ClientSession(timeout=timeout, trust_env=False,
                                      connector=aiohttp.TCPConnector(force_close=True)
                                      ) as self._fresh:
            await asyncio.gather(*(self._client(session, i) for i in range(self.concurrency)))

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        raise NotImplementedError

    async def _post(self, session: aiohttp.ClientSession, body: dict[str, Any],
                    request: Resendable) -> aiohttp.ClientResponse:
        """POST ``body``; once more, on a new connection, if the first try's connection
        failed before any byte of an answer (``kernels_bench.lab.faults.resend``: then
        ``request.resent`` or ``request.resent_unanswered``)."""
        try:
            return await session.post(self.url, json=body)
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            if unsent(exc):
                request.resent = True
            elif unanswered(exc):
                request.resent_unanswered = True
            else:
                raise
        return await self._fresh.post(self.url, json=body)


class Resendable(Protocol):
    resent: bool
    resent_unanswered: bool


def transport_outcome(exc: aiohttp.ClientError | asyncio.TimeoutError) -> str:
    """A request that failed below HTTP: ``refused`` (no connection), ``lost`` (no answer
    in time), else ``cut``."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "refused"
    return "lost" if isinstance(exc, asyncio.TimeoutError) else "cut"


class Load(ClosedLoop):
    """Closed-loop clients, plain and streamed in turn, each request tagged with the
    current ``phase``."""

    def __init__(self, url: str, model: str, concurrency: int, timeout_s: float) -> None:
        super().__init__(url, model, concurrency, timeout_s)
        self.phase = "steady"
        self.records: list[Record] = []

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            rec = Record(time.time(), stream=(i + n) % 2 == 0)
            self.records.append(rec)
            await self._one(session, rec)
            rec.seconds, rec.phase = time.time() - rec.sent, self.phase
            if rec.outcome == "refused":
                await asyncio.sleep(0.05)

    async def _one(self, session: aiohttp.ClientSession, rec: Record) -> None:
        body = {"model": self.model, "max_tokens": 24, "stream": rec.stream,
                "messages": [{"role": "user", "content": "Count from one to twenty."}]}
        try:
            async with await self._post(session, body, rec) as resp:
                data = await resp.read()
                rec.outcome, rec.detail = _classify(resp.status, rec.stream, data)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            rec.outcome, rec.detail = transport_outcome(exc), repr(exc)[:200]


def _classify(status: int, stream: bool, data: bytes) -> tuple[str, str]:
    if status != 200:
        try:
            message = json.loads(data)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return "lost", f"{status} without an OpenAI error: {data[:200]!r}"
        return "error", f"{status}: {str(message)[:200]}"
    if not stream:
        try:
            json.loads(data)["choices"]
        except (ValueError, KeyError, TypeError):
            return "lost", f"incomplete answer: {data[-200:]!r}"
        return "ok", ""
    if data.rstrip().endswith(b"data: [DONE]"):
        return "ok", ""
    if b'data: {"error"' in data:
        return "error", data[-300:].decode(errors="replace")
    return "lost", f"stream ended with neither [DONE] nor an error: {data[-200:]!r}"


class Cluster:
    """``python -m launcher FILE`` with its output in a file."""

    def __init__(self, config: Path, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.out = run_dir.parent / "launcher.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "launcher", str(config), "--run-dir", str(run_dir)],
                stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, what: str, pattern: str, timeout_s: float, after: int = 0) -> float:
        """Wait until ``pattern`` appears in the launcher's output past offset ``after``;
        returns the time it was seen."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if re.search(pattern, self.output()[after:], re.MULTILINE):
                return time.time()
            if self.proc.poll() is not None:
                raise RuntimeError(f"the launcher exited while waiting for {what}:\n"
                                   + self.output()[-3000:])
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}:\n" + self.output()[-3000:])

    def process(self, match: list[str]) -> psutil.Process:
        """The launcher's child whose command line holds ``match`` in order."""
        for child in psutil.Process(self.proc.pid).children():
            cmd = child.cmdline()
            if any(cmd[i:i + len(match)] == match for i in range(len(cmd))):
                return child
        raise RuntimeError(f"no process {' '.join(match)} under the launcher")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _metric(router_url: str, pattern: str) -> float | None:
    try:
        text = httpx.get(router_url + "/metrics", timeout=1.0, trust_env=False).text
    except httpx.HTTPError:
        return None
    found = re.search(pattern + r" (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _until_down(router_url: str, engine: str, since: float, timeout_s: float) -> float | None:
    pattern = rf'^hetserve_engine_up\{{engine="{re.escape(engine)}"[^}}]*\}}'
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _metric(router_url, pattern) == 0.0:
            return time.time() - since
        time.sleep(0.05)
    return None


def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="hs-faults-", dir="/tmp") as tmp:
        cluster = Cluster(args.cluster, Path(tmp) / "run")
        try:
            return _run(args, cluster)
        finally:
            cluster.stop()


def _run(args: argparse.Namespace, cluster: Cluster) -> dict[str, object]:
    t_end = time.monotonic() + args.max_seconds
    cluster.wait_for("the cluster", r"^ENGINE +KIND +MODEL", args.start_timeout_s)
    cfg: ClusterConfig = load_cluster_config(cluster.run_dir / "cluster.resolved.toml")
    url = cfg.router_url()
    engines = [i.name for i in cfg.instances()]
    model = cfg.instances()[0].served_model_name
    print(f"cluster up: router {url}, engines {', '.join(engines)}", flush=True)
    load = Load(url, model, args.concurrency, args.request_timeout_s)
    phases: list[Phase] = [Phase("steady")]
    load.start()

    def redispatched() -> float:
        return _metric(url, r"^hetserve_redispatched_total") or 0.0

    def phase(name: str) -> Phase:
        so_far = Counter(r.outcome for r in load.records if r.phase == load.phase)
        so_far.pop("pending", None)
        print(f"  {load.phase}: {dict(so_far)}", flush=True)
        load.phase = name
        p = Phase(name)
        phases.append(p)
        print(f"phase {name}", flush=True)
        return p

    try:
        time.sleep(args.settle_s)
        for name, victim in (("kill-engine", engines[0]), ("stop-engine", engines[-1])):
            if time.monotonic() > t_end:
                break
            p = phase(name)
            base = redispatched()
            mark = len(cluster.output())
            tree = cluster.process(["--engine-id", victim])
            procs = [tree, *tree.children(recursive=True)]
            p.fault_at = time.time()
            if name == "kill-engine":
                tree.send_signal(signal.SIGKILL)
            else:
                for proc in procs:
                    proc.suspend()
            p.down_after_s = _until_down(url, victim, p.fault_at, 60)
            seen = cluster.wait_for(f"{victim} back", rf"{re.escape(victim)} is up again",
                                    args.start_timeout_s, mark)
            p.back_after_s = seen - p.fault_at
            time.sleep(args.settle_s)
            p.redispatched = redispatched() - base
        if time.monotonic() < t_end:
            p = phase("kill-router")
            mark = len(cluster.output())
            router = cluster.process(["-m", "router"])
            p.fault_at = time.time()
            router.send_signal(signal.SIGKILL)
            seen = cluster.wait_for("the router back", r"\brouter is up again",
                                    args.start_timeout_s, mark)
            p.back_after_s = seen - p.fault_at
            time.sleep(args.settle_s)
        phase("end")
    finally:
        load.stop()
    counts: dict[str, Counter[str]] = {p.name: Counter() for p in phases}
    for rec in load.records:
        if rec.outcome == "pending":
            rec.phase, rec.outcome, rec.detail = "end", "lost", "no answer when the load stopped"
        counts[rec.phase][rec.outcome] += 1
    for p in phases:
        p.outcomes = {o: counts[p.name][o] for o in OUTCOMES}
        p.resent = sum(1 for r in load.records if r.phase == p.name and r.resent)
        p.resent_unanswered = sum(1 for r in load.records
                                  if r.phase == p.name and r.resent_unanswered)
    samples = [asdict(r) for r in load.records if r.outcome != "ok"][:200]
    events = [line for line in cluster.output().splitlines()
              if re.search(r"killed|wedged|exited|up again|restart", line)]
    return {"cluster": str(args.cluster.name), "concurrency": args.concurrency,
            "engines": engines, "phases": [asdict(p) for p in phases],
            "launcher_events": events, "not_ok": samples}


def table(result: dict[str, object]) -> str:
    lines = ["| phase | ended | ok | error (clear) | refused (router down) | cut (router "
             "died) | lost | resent (by the client: unsent) | resent (unanswered) | "
             "re-dispatched | routed around after | back after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["phases"]:  # type: ignore[attr-defined]
        o = p["outcomes"]

        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} s"

        lines.append(f"| {p['name']} | {sum(o.values())} | {o['ok']} | {o['error']} | "
                     f"{o['refused']} | {o['cut']} | {o['lost']} | {p['resent']} | "
                     f"{p.get('resent_unanswered', 0)} | "
                     f"{p['redispatched']:.0f} | "
                     f"{secs(p['down_after_s'])} | {secs(p['back_after_s'])} |")
    return "\n".join(lines)
