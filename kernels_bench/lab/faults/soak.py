"""``python -m kernels_bench soak``: faults repeated under load for a set duration.

Starts a cluster with the launcher (default ``examples/soak.toml``: two replicas of one
tiny model behind two router workers), keeps ``--concurrency`` closed-loop clients busy
and repeats a fault schedule (``--only``: some of its faults) until ``--duration-s`` has
passed, each fault after the cluster recovered from the last:

- ``kill-engine``: SIGKILL to an engine's server (the launcher restarts it);
- ``stop-engine``: SIGSTOP to an engine and its children (the launcher finds it wedged,
  kills and restarts it);
- ``kill-router-worker``: SIGKILL to one router worker (the other keeps the port);
- ``restart-launcher``: SIGTERM to the launcher (a graceful stop of the whole cluster)
  and a new launcher on the same file, as an operator restarts a cluster.

Clients cycle through five kinds of call: a chat answer, a streamed one, a three-stage
program (workflow metadata, one program id), a stream the client abandons after its first
chunk, and a chat answer to a prompt no call shared before (``fresh``: it stores new KV
blocks, so engines keep evicting and the router's KV index keeps changing). Every request
is classified as in ``kernels_bench faults`` (``ok``, ``error``, ``refused``, ``cut``,
``lost``; ``abandoned`` for a deliberate disconnect; those their client sent twice,
``resent`` and ``resent_unanswered``, counted apart: ``kernels_bench.lab.faults.resend``) and
attributed to the fault window it ended in. Every ``--sample-s`` the tool samples each
process of the cluster (RSS and open descriptors, the engine's tree summed) and each
router worker's ``/metrics`` (its RSS, descriptors, asyncio tasks, program-table, KV-index
and in-flight ledger sizes). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import httpx
import psutil

from kernels_bench.lab.faults.signals import (OUTCOMES, ClosedLoop, Cluster, _classify,
                                              transport_outcome)
from router.config.cluster import ClusterConfig, load_cluster_config

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CLUSTER = ROOT / "examples" / "soak.toml"
SCHEDULE = ("kill-engine", "stop-engine", "kill-router-worker", "restart-launcher")
KINDS = ("chat", "stream", "program", "abandon", "fresh")
PROGRAM_STAGES = 3
PREAMBLE = " ".join(f"Rule {i}: answer briefly and count carefully." for i in range(12))
"""A shared system prompt of some 250 tokens: longer than a KV block, so engines publish
KV events and the router's KV index has blocks."""
TIMELINE_S = 10.0
"""Width of the bins of the outcomes' timeline."""
ROUTER_GAUGES = {
    "rss_bytes": "process_resident_memory_bytes",
    "fds": "process_open_fds",
    "tasks": "hetserve_asyncio_tasks",
    "programs": "hetserve_programs",
    "kv_index_blocks": "hetserve_engine_kv_index_blocks",
    "ledger": "hetserve_inflight_ledger_entries",
    "open_requests": "hetserve_open_requests",
}
"""Sample field -> the router worker's metric (summed over its label sets)."""


@dataclass
class Call:
    """One request: when it was sent and ended, and what its client got."""

    sent: float
    kind: str
    ended: float = 0.0
    outcome: str = "pending"
    detail: str = ""
    resent: bool = False
    """Sent again on a new connection (``resend.unsent``)."""
    resent_unanswered: bool = False
    """Sent again on a new connection (``resend.unanswered``)."""


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    routed_around_s: float | None = None
    """Until every router worker had marked the engine down: the largest of
    ``worker_down_s`` (the scrapes that read it take a while on a busy CPU; the router's
    own timestamp does not)."""
    worker_down_s: list[float | None] = field(default_factory=list)
    """Per router worker, until it marked the engine down: its
    ``hetserve_engine_down_timestamp_seconds`` less the fault's time, read once its
    ``hetserve_engine_up`` read 0 (engine faults; None: not within 30 s)."""
    worker_last_sent_s: list[float | None] = field(default_factory=list)
    """Per router worker, when the engine's last snapshot it received was stamped by the
    engine (``hetserve_telemetry_sent_timestamp_seconds``) less the fault's time, read with
    ``worker_down_s``: a negative value is a snapshot sent before the fault."""
    worker_last_received_s: list[float | None] = field(default_factory=list)
    """The same for when that worker received it
    (``hetserve_telemetry_received_timestamp_seconds``): less ``worker_last_sent_s``, how
    late the worker read the engine's last word; ``worker_down_s`` less this, how long
    after that it marked the engine down (for a stopped engine: the heartbeat timeout,
    plus the time until a decision, a scrape or the sweep applied it)."""
    launcher_saw_s: float | None = None
    """Until the launcher printed that the engine died or was wedged (engine faults)."""
    back_s: float | None = None
    """Until the target served again: an engine routed to by every worker, a router
    worker up, the restarted cluster's table printed."""
    outcomes: dict[str, int] = field(default_factory=dict)
    """Requests that ended between this fault and the next."""
    resent: int = 0
    """Requests among them sent twice by their client (``unsent``)."""
    resent_unanswered: int = 0
    """Requests among them sent twice by their client (``unanswered``)."""


class Clients(ClosedLoop):
    """Closed-loop clients cycling through ``KINDS`` of call."""

    calls_per_turn = PROGRAM_STAGES

    def __init__(self, url: str, model: str, concurrency: int, timeout_s: float) -> None:
        super().__init__(url, model, concurrency, timeout_s)
        self.calls: list[Call] = []

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            kind = KINDS[(i + n) % len(KINDS)]
            n += 1
            if kind == "program":
                program = f"soak-{uuid.uuid4().hex[:12]}"
                for stage in range(PROGRAM_STAGES):
                    workflow = {"program_id": program, "workflow": "soak",
                                "stage": f"s{stage}", "stage_index": stage,
                                "num_stages": PROGRAM_STAGES,
                                "final": stage == PROGRAM_STAGES - 1}
                    if await self._call(session, kind, workflow) != "ok":
                        break
            else:
                await self._call(session, kind, None)

    async def _call(self, session: aiohttp.ClientSession, kind: str,
                    workflow: dict[str, object] | None) -> str:
        call = Call(time.time(), kind)
        self.calls.append(call)
        stream = kind in ("stream", "abandon")
        system = f"Session {uuid.uuid4().hex}. {PREAMBLE}" if kind == "fresh" else PREAMBLE
        body: dict[str, object] = {
            "model": self.model, "max_tokens": 24, "stream": stream,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "Count from one to twenty."}]}
        if workflow is not None:
            body["workflow"] = workflow
        try:
            async with await self._post(session, body, call) as resp:
                if kind == "abandon" and resp.status == 200:
                    first = await resp.content.readline()
                    resp.close()  # the client goes away mid-stream
                    call.outcome = "abandoned" if first.startswith(b"data: ") else "lost"
                    call.detail = first[:200].decode(errors="replace")
                else:
                    call.outcome, call.detail = _classify(resp.status, stream,
                                                          await resp.read())
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            call.outcome, call.detail = transport_outcome(exc), repr(exc)[:200]
        call.ended = time.time()
        if call.outcome == "refused":
            await asyncio.sleep(0.05)
        return call.outcome


def _metrics(url: str) -> str | None:
    try:
        return httpx.get(url + "/metrics", timeout=2.0, trust_env=False).text
    except httpx.HTTPError:
        return None


def _sum(text: str, name: str, labels: str = "") -> float | None:
    """The sum of metric ``name`` over its samples whose labels hold ``labels``."""
    values = [float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:\{{[^}}]*{re.escape(labels)}[^}}]*\}})? (\S+)$", text,
        re.MULTILINE)]
    return sum(values) if values else None


class Sampler:
    """Every ``interval_s``: each process of the cluster (psutil) and each router worker's
    ``/metrics``, into ``samples`` (one dict per process and time)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, object]] = []
        self.cluster: Cluster | None = None
        self.worker_urls: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.cluster is not None:
                self.sample(self.cluster, time.time())

    def sample(self, cluster: Cluster, now: float) -> None:
        try:
            launcher = psutil.Process(cluster.proc.pid)
            rows = [("launcher", [launcher])]
            for child in launcher.children():
                cmd = child.cmdline()
                if "--engine-id" in cmd:
                    name = cmd[cmd.index("--engine-id") + 1]
                    rows.append((name, [child, *child.children(recursive=True)]))
                elif "--worker" in cmd:
                    rows.append((f"router-{cmd[cmd.index('--worker') + 1]}", [child]))
        except psutil.Error:
            return
        for name, procs in rows:
            rss = fds = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                    fds += p.num_fds()
                except psutil.Error:
                    continue
            self.samples.append({"t": now, "process": name, "source": "psutil",
                                 "rss_bytes": rss, "fds": fds})
        for i, url in enumerate(self.worker_urls):
            text = _metrics(url)
            if text is None:
                continue
            row: dict[str, object] = {"t": now, "process": f"router-{i}", "source": "metrics"}
            row.update({k: _sum(text, m) for k, m in ROUTER_GAUGES.items()})
            self.samples.append(row)


class Soak:
    """The cluster, its clients, its sampler and the fault schedule."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.runs = 0
        self.cluster = self._launch()
        self.faults: list[Fault] = []
        self.events: list[str] = []
        self.sampler = Sampler(args.sample_s)

    def _launch(self) -> Cluster:
        self.runs += 1
        run_dir = self.tmp / f"run-{self.runs}"
        run_dir.mkdir()
        return Cluster(self.args.cluster, run_dir / "run")

    def _up(self) -> ClusterConfig:
        self.cluster.wait_for("the cluster", r"^ENGINE +KIND +MODEL",
                              self.args.start_timeout_s)
        cfg = load_cluster_config(self.cluster.run_dir / "cluster.resolved.toml")
        r = cfg.router
        self.worker_urls = [f"http://{r.host}:{p}" for p in r.worker_ports or [r.port]]
        self.engines = [i.name for i in cfg.instances()]
        self.sampler.worker_urls, self.sampler.cluster = self.worker_urls, self.cluster
        return cfg

    def _engine_up(self, engine: str) -> list[float | None]:
        pattern = f'engine="{engine}"'
        return [None if (text := _metrics(u)) is None
                else _sum(text, "hetserve_engine_up", pattern) for u in self.worker_urls]

    def _watch_down(self, fault: Fault, mark: int, timeout_s: float) -> None:
        """Poll every worker's ``/metrics`` for ``fault.target`` and the launcher's output
        until every worker has it down, noting when each marked it down (its own
        timestamp) and when the launcher was seen to say the engine died or hung."""
        line = rf"{re.escape(fault.target)} (killed|exited|wedged)"
        pattern = f'engine="{fault.target}"'
        n = len(self.worker_urls)
        down: list[float | None] = [None] * n
        sent: list[float | None] = [None] * n
        received: list[float | None] = [None] * n

        def since_fault(text: str, name: str) -> float | None:
            value = _sum(text, name, pattern)
            return None if value is None else value - fault.at

        def check() -> bool:
            for i, u in enumerate(self.worker_urls):
                if down[i] is not None or (text := _metrics(u)) is None:
                    continue
                at = since_fault(text, "hetserve_engine_down_timestamp_seconds")
                if _sum(text, "hetserve_engine_up", pattern) == 0.0 and at is not None \
                        and at >= 0:
                    down[i] = at
                    sent[i] = since_fault(text, "hetserve_telemetry_sent_timestamp_seconds")
                    received[i] = since_fault(
                        text, "hetserve_telemetry_received_timestamp_seconds")
            if fault.launcher_saw_s is None and re.search(line, self.cluster.output()[mark:]):
                fault.launcher_saw_s = time.time() - fault.at
            return all(d is not None for d in down)

        self._until(check, timeout_s)
        fault.worker_down_s = down
        fault.worker_last_sent_s, fault.worker_last_received_s = sent, received
        fault.routed_around_s = None if None in down else max(d for d in down if d is not None)

    def _until(self, check, timeout_s: float, poll_s: float = 0.05) -> float | None:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if check():
                return time.time() - t0
            time.sleep(poll_s)
        return None

    def run(self) -> dict[str, object]:
        args = self.args
        cfg = self._up()
        model = cfg.instances()[0].served_model_name
        clients = Clients(cfg.router_url(), model, args.concurrency, args.request_timeout_s)
        self.sampler.start()
        clients.start()
        t_start = time.time()
        t_end = t_start + args.duration_s
        print(f"cluster up: router {cfg.router_url()} ({len(self.worker_urls)} workers), "
              f"engines {', '.join(self.engines)}; soak for {args.duration_s:g} s",
              flush=True)
        try:
            schedule = [k for k in SCHEDULE if k in (args.only or SCHEDULE)]
            n = 0
            while time.time() + args.settle_s < t_end:
                time.sleep(args.settle_s)
                kind = schedule[n % len(schedule)]
                try:
                    self._inject(kind, n // len(schedule))
                except RuntimeError as exc:  # a target gone for good, a launcher that
                    # exited: what was measured so far is kept, no further fault
                    self.events.append(f"soak: {kind} stopped the schedule: {exc}"[:3000])
                    print(self.events[-1], flush=True)
                    break
                n += 1
            time.sleep(max(0.0, t_end - time.time()))
        finally:
            clients.stop()
            self.sampler.stop()
            self.events += self._events()
            self.cluster.stop()
        return self._result(clients.calls, t_start)

    def _inject(self, kind: str, cycle: int) -> None:
        args = self.args
        mark = len(self.cluster.output())
        if kind in ("kill-engine", "stop-engine"):
            target = self.engines[(cycle + (kind == "stop-engine")) % len(self.engines)]
            tree = self.cluster.process(["--engine-id", target])
            # listed before the fault's time (listing takes up to 0.3 s on a busy CPU, which
            # the EngineCore spent stepping and publishing); it stops first, then the server
            stopped = [*tree.children(recursive=True), tree] if kind == "stop-engine" else []
            fault = Fault(kind, target, time.time())
            if kind == "kill-engine":
                tree.send_signal(signal.SIGKILL)
            for p in stopped:
                p.suspend()
            self._watch_down(fault, mark, 30.0)
            self.faults.append(fault)
            print(f"{kind} {target}", flush=True)
            seen = self._until(lambda: re.search(rf"{re.escape(target)} is up again",
                                                 self.cluster.output()[mark:]),
                               args.recovery_timeout_s, 0.5)
            if seen is not None:
                routed = self._until(lambda: all(v == 1.0 for v in self._engine_up(target)),
                                     args.recovery_timeout_s - seen, 0.2)
                fault.back_s = None if routed is None else time.time() - fault.at
        elif kind == "kill-router-worker":
            worker = cycle % len(self.worker_urls)
            target = f"router-{worker}" if len(self.worker_urls) > 1 else "router"
            proc = self.cluster.process(["-m", "router", "--config"] if target == "router"
                                        else ["--worker", str(worker)])
            fault = Fault(kind, target, time.time())
            proc.send_signal(signal.SIGKILL)
            self.faults.append(fault)
            print(f"{kind} {target}", flush=True)
            seen = self._until(lambda: re.search(rf"\b{target} is up again",
                                                 self.cluster.output()[mark:]),
                               args.recovery_timeout_s, 0.2)
            fault.back_s = None if seen is None else time.time() - fault.at
        else:
            fault = Fault(kind, "launcher", time.time())
            self.faults.append(fault)
            print(f"{kind}", flush=True)
            self.events += self._events()
            self.cluster.stop()
            self.sampler.cluster = None
            self.cluster = self._launch()
            self._up()
            fault.back_s = time.time() - fault.at
        print(f"  back after {fault.back_s if fault.back_s is None else round(fault.back_s, 1)}"
              f" s", flush=True)
        if fault.back_s is None:  # not back in time: wait for it before the next fault
            self._until(lambda: f"{fault.target} is up again" in self.cluster.output()[mark:],
                        args.start_timeout_s, 1.0)

    def _events(self) -> list[str]:
        return [line for line in self.cluster.output().splitlines()
                if re.search(r"killed|wedged|exited|up again|restart|gave up|taken", line)]

    def _result(self, calls: list[Call], t_start: float) -> dict[str, object]:
        for c in calls:
            if c.outcome == "pending":
                c.outcome, c.detail, c.ended = "lost", "no answer when the load stopped", \
                    time.time()
        starts = [f.at for f in self.faults]
        steady: Counter[str] = Counter()
        windows: list[Counter[str]] = [Counter() for _ in self.faults]
        for c in calls:
            k = sum(1 for s in starts if s <= c.ended) - 1
            window = steady if k < 0 else windows[k]
            window[c.outcome] += 1
            window["resent"] += c.resent
            window["resent_unanswered"] += c.resent_unanswered
        for f, w in zip(self.faults, windows):
            f.outcomes = {o: w[o] for o in (*OUTCOMES, "abandoned")}
            f.resent, f.resent_unanswered = w["resent"], w["resent_unanswered"]
        total = Counter(c.outcome for c in calls)
        timeline: dict[int, Counter[str]] = {}
        for c in calls:
            timeline.setdefault(int((c.ended - t_start) // TIMELINE_S), Counter())[c.outcome] += 1
        return {"cluster": str(self.args.cluster.name), "concurrency": self.args.concurrency,
                "duration_s": self.args.duration_s, "sample_s": self.args.sample_s,
                "t_start": t_start, "engines": self.engines,
                "outcomes": {o: total[o] for o in (*OUTCOMES, "abandoned")},
                "resent": sum(c.resent for c in calls), "steady_resent": steady["resent"],
                "resent_unanswered": sum(c.resent_unanswered for c in calls),
                "steady_resent_unanswered": steady["resent_unanswered"],
                "by_kind": {k: dict(Counter(c.outcome for c in calls if c.kind == k))
                            for k in KINDS},
                "steady": {o: steady[o] for o in (*OUTCOMES, "abandoned")},
                "faults": [asdict(f) for f in self.faults],
                "samples": self.sampler.samples, "launcher_events": self.events,
                "timeline_s": TIMELINE_S,
                "timeline": {str(k): dict(v) for k, v in sorted(timeline.items())},
                "not_ok": [asdict(c) for c in calls
                           if c.resent or c.resent_unanswered
                           or c.outcome not in ("ok", "abandoned", "refused")][:5000]}


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """The soak, its clusters' run directories under ``tmp``."""
    return Soak(args, tmp).run()
