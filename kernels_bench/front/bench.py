"""``python -m kernels_bench front``: the router's HTTP front under load, beside its peers.

Two stand-in engines (``kernels_bench.front.standin``) and the load generator (``wrk``, one
thread) share ``--load-core``; each router under test runs alone on ``--router-core``
(``taskset``). Per target, per request kind (``plain``: a non-streamed chat completion,
``stream``: the same streamed as SSE) and per connection count, wrk posts the same chat
request for ``--seconds`` after a one-second warm-up. Targets:

- ``direct``: wrk straight at one stand-in engine: the ceiling, which must be far above
  every router (printed first);
- ``hetserve:<policy>``: ``python -m router`` with that policy (``chimera`` picks the
  model itself: ``model = "auto"`` over two served models, static priors;
  ``chimera-trained`` the same on trained predictors: a semantic router and a length
  forest trained once into ``--artifacts`` on SYNTHETIC records with ``python -m
  router.train``, one epoch: the accuracy is not the point here, the inference cost is);
- ``hetserve@base:<policy>``: the same from another checkout (``--base-src``), to compare
  a change in the same run;
- ``hetserve:<policy>/<N>``: ``N`` router processes on one port (``[router] workers``),
  not pinned: they share every core with the stand-ins and wrk (compare ``/1``, one such
  process, in the same run);
- ``vllm-router:<policy>`` and ``smg:<policy>``: the Rust routers from PyPI, unchanged
  (``make peers``; skipped with a line when not installed);
- ``passthrough``: ``kernels_bench.front.passthrough``, the Python ceiling.

``--repeats`` runs every target that many times, target order rotated each repeat.
Prints successful requests/s, p50/p99 and errors per cell and the ratio to vllm-router's
round robin; writes JSON (``--out``) and a plot next to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from kernels_bench.front import openloop, wrk

TARGETS = ("direct", "hetserve:round_robin", "hetserve:vllm", "hetserve:chimera",
           "hetserve:chimera-trained", "vllm-router:round_robin", "smg:round_robin",
           "passthrough")
KINDS = ("direct", "hetserve", "hetserve@base", "vllm-router", "smg", "passthrough")
BASELINE = "vllm-router:round_robin"
PROMPT = "A farmer has 17 sheep and buys 23 more. How many legs do the sheep have in all?"
CHIMERA = """
[router.policies.chimera]
static_prior = true
confidence = { tiny-a = 0.6, tiny-b = 0.8 }
mean_output_tokens = { tiny-a = 48, tiny-b = 48 }
decode_ms_per_token = { tiny-a = 2.5, tiny-b = 10.0 }
max_batch_size = { tiny-a = 64, tiny-b = 64 }
"""
TRAINED_MODELS = ("synthetic-small", "synthetic-large")
"""The served model names of the SYNTHETIC records the trained predictors learn."""
TRAIN = {"semantic_router": ["--set", "epochs=1"], "length": []}
TRAIN_DATA = "synthetic:60"


def ensure_artifacts(root: Path) -> Path:
    """Trained predictors and profiles for ``chimera-trained`` under ``root`` (made once)."""
    for name, extra in TRAIN.items():
        if not (root / name).exists():
            print(f"training {name} on {TRAIN_DATA} into {root / name} (once)", flush=True)
            subprocess.run([sys.executable, "-m", "router.train", name, "--data", TRAIN_DATA,
                            "--out", str(root / name), *extra], check=True)
    profiles = {m: {"decode_ms_per_token": ms, "max_batch_size": 64, "mean_output_tokens": 48.0}
                for m, ms in zip(TRAINED_MODELS, (2.5, 10.0))}
    (root / "profiles.json").write_text(json.dumps(profiles))
    return root


@dataclass(frozen=True)
class Cell:
    target: str
    mode: str
    connections: int
    repeat: int
    ok_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pinned(core: int | None, cmd: list[str]) -> list[str]:
    return cmd if core is None else ["taskset", "-c", str(core), *cmd]


@contextlib.contextmanager
def _process(cmd: list[str], env: dict[str, str] | None = None,
             cwd: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
            log.seek(0)
            sys.stderr.write(f"{cmd[0]} ... exited with {proc.returncode}:\n"
                             + log.read().decode(errors="replace")[-2000:])
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0, trust_env=False).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def _cluster_toml(policy: str, port: int, engines: list[str], tmp: Path,
                  artifacts: Path, worker_ports: list[int]) -> tuple[Path, str]:
    """A router cluster file over the stand-ins (``worker_ports``: one per router worker,
    none for a lone router), and the model the requests name."""
    trained = policy == "chimera-trained"
    chimera = policy.startswith("chimera")
    lines = ["[router]", f'policy = "{"chimera" if chimera else policy}"', 'host = "127.0.0.1"',
             f"port = {port}"]
    if worker_ports:
        lines += [f"workers = {len(worker_ports)}", f"worker_ports = {worker_ports}",
                  f'sync_dir = "{tmp}"']
    lines.append("")
    if trained:
        root = ensure_artifacts(artifacts).resolve()
        lines += ["[router.predictors]", *(f'{n} = "{root / n}"' for n in TRAIN),
                  f'profiles = "{root / "profiles.json"}"', ""]
    elif chimera:
        lines.append(CHIMERA)
    names = TRAINED_MODELS if trained else ("tiny-a", "tiny-b") if chimera else ("tiny-a",)
    for i, url in enumerate(engines):
        served = names[i % len(names)]
        lines += ["[[engines]]", f'name = "e{i}"', f'url = "{url}"',
                  'model = "builtin:tiny-a"', f'served_model_name = "{served}"',
                  f'telemetry_endpoint = "ipc://{tmp}/e{i}.telemetry"',
                  f'kv_events_endpoint = "ipc://{tmp}/e{i}.kv"', ""]
    path = tmp / f"{policy}-{len(worker_ports)}.toml"
    path.write_text("\n".join(lines))
    return path, "auto" if chimera else "tiny-a"


def _peer_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else None


@contextlib.contextmanager
def _router(target: str, engines: list[str], core: int | None, base_src: str | None,
            tmp: Path, artifacts: Path) -> Iterator[tuple[str, str]]:
    """Start ``target``; yield its base URL and the model name to request."""
    kind, _, policy = target.partition(":")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cwd = None
    if kind == "direct":
        yield engines[0], "tiny-a"
        return
    policy, _, workers = policy.partition("/")
    if workers and kind == "hetserve":  # every worker on every core
        n = int(workers)
        worker_ports = [_free_port() for _ in range(n)] if n > 1 else []
        config, model = _cluster_toml(policy, port, engines, tmp, artifacts, worker_ports)
        cmd = [sys.executable, "-m", "router", "--config", str(config), "--log-level", "warning"]
        with contextlib.ExitStack() as stack:
            for i, ready_url in enumerate([f"http://127.0.0.1:{p}" for p in worker_ports]
                                          or [url]):
                argv = [*cmd, "--worker", str(i)] if worker_ports else cmd
                proc = stack.enter_context(_process(argv, env=env))
                _wait_ready(ready_url + "/health", proc)
            yield url, model
        return
    if kind in ("hetserve", "hetserve@base"):
        config, model = _cluster_toml(policy, port, engines, tmp, artifacts, [])
        cmd = [sys.executable, "-m", "router", "--config", str(config), "--log-level", "warning"]
        if kind == "hetserve@base":
            assert base_src is not None
            env["PYTHONPATH"] = base_src
            cwd = base_src
        ready = url + "/health"
    elif kind == "passthrough":
        cmd = [sys.executable, "-m", "kernels_bench.front.passthrough", "--port", str(port),
               *(a for e in engines for a in ("--engine", e))]
        model, ready = "tiny-a", None
    else:
        binary = _peer_binary(kind)
        assert binary is not None
        cmd = [binary] + (["launch"] if kind == "smg" else [])
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                "--log-level", "error" if kind == "smg" else "warning",
                "--worker-urls", *engines]
        model, ready = "tiny-a", url + "/health"
    with _process(_pinned(core, cmd), env=env, cwd=cwd) as proc:
        _wait_ready(ready or url + "/v1/models", proc)
        yield url, model


def _body(model: str, stream: bool) -> dict[str, object]:
    body: dict[str, object] = {"model": model, "max_tokens": 16,
                               "messages": [{"role": "user", "content": PROMPT}]}
    if stream:
        body["stream"] = True
    return body


def _available(targets: list[str], base_src: str | None) -> list[str]:
    out = []
    for target in targets:
        kind = target.partition(":")[0]
        if kind in ("vllm-router", "smg") and _peer_binary(kind) is None:
            print(f"skipped {target}: `{kind}` is not installed (make peers)")
        elif kind == "hetserve@base" and base_src is None:
            print(f"skipped {target}: give --base-src")
        else:
            out.append(target)
    return out


def run(args: argparse.Namespace) -> list[Cell]:
    binary = wrk.find_wrk()
    if binary is None:
        sys.exit("front: wrk is not installed (Debian/Ubuntu: apt-get install wrk)")
    targets = _available(args.targets, args.base_src)
    cells: list[Cell] = []
    ports = [_free_port() for _ in range(2)]
    engines = [f"http://127.0.0.1:{p}" for p in ports]
    standin = [sys.executable, "-m", "kernels_bench.front.standin", "--chunks", str(args.chunks),
               "--interval-ms", str(args.interval_ms),
               *(a for p in ports for a in ("--port", str(p)))]
    with tempfile.TemporaryDirectory(prefix="hs-front-", dir="/tmp") as tmp, \
            _process(_pinned(args.load_core, standin)) as engine_proc:
        _wait_ready(engines[0] + "/v1/models", engine_proc)
        total = len(targets) * args.repeats * (len(args.modes) * len(args.connections)
                                               + len(args.open_rates))
        done = 0
        for repeat in range(args.repeats):
            shift = repeat % len(targets)
            for target in targets[shift:] + targets[:shift]:
                core = args.load_core if target == "direct" else args.router_core
                with _router(target, engines, core, args.base_src, Path(tmp),
                             args.artifacts) as (url, model):
                    for mode in args.modes:
                        path = url + "/v1/chat/completions"
                        body = _body(model, mode == "stream")
                        for conns in args.connections:
                            wrk.run(binary, path, body, conns, 1.0, args.load_core)
                            r = wrk.run(binary, path, body, conns, args.seconds, args.load_core)
                            done += 1
                            cells.append(Cell(target, mode, conns, repeat, r.ok_per_s, r.p50_ms,
                                              r.p99_ms, r.errors, r.requests))
                            print(f"[{done}/{total}] {target:28} {mode:6} c={conns:<5} "
                                  f"{r.ok_per_s:9.0f} req/s  p50 {r.p50_ms:7.2f} ms  "
                                  f"p99 {r.p99_ms:8.2f} ms  errors {r.errors}", flush=True)
                    for rate in args.open_rates:
                        r = _open_loop(url + "/v1/chat/completions", _body(model, False),
                                       rate, args.seconds, args.load_core)
                        done += 1
                        cells.append(Cell(target, "open", rate, repeat, r.ok_per_s, r.p50_ms,
                                          r.p99_ms, r.errors, r.requests))
                        print(f"[{done}/{total}] {target:28} open   {rate:>5} req/s sent "
                              f"{r.ok_per_s:6.0f} ok/s  p50 {r.p50_ms:7.2f} ms  "
                              f"p99 {r.p99_ms:8.2f} ms  errors {r.errors}", flush=True)
    return cells


def _open_loop(url: str, body: dict[str, object], rate: int, seconds: float,
               core: int | None) -> wrk.WrkResult:
    """``openloop.run`` from this process, on ``core`` like wrk."""
    before = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        openloop.run(url, body, rate, 1.0)  # warm-up
        return openloop.run(url, body, rate, seconds)
    finally:
        os.sched_setaffinity(0, before)


def summarize(cells: list[Cell]) -> list[dict[str, object]]:
    """Per (target, mode, connections): mean, min and max over repeats, ratio to baseline."""
    groups: dict[tuple[str, str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.target, c.mode, c.connections), []).append(c)
    rows = []
    for (target, mode, conns), group in groups.items():
        rates = [c.ok_per_s for c in group]
        base = groups.get((BASELINE, mode, conns))
        ratio = statistics.fmean(rates) / statistics.fmean(c.ok_per_s for c in base) \
            if base else None
        row: dict[str, object] = {
            "target": target, "mode": mode, "connections": conns,
            "ok_per_s": statistics.fmean(rates), "min": min(rates), "max": max(rates),
            "p50_ms": statistics.median(c.p50_ms for c in group),
            "p99_ms": statistics.median(c.p99_ms for c in group),
            "errors": sum(c.errors for c in group), "repeats": len(group),
            "ratio_to_vllm_router": ratio}
        direct = {c.repeat: c.p99_ms for c in groups.get(("direct", mode, conns), [])}
        if mode == "open" and direct and target != "direct":
            added = [c.p99_ms - direct[c.repeat] for c in group if c.repeat in direct]
            row["added_p99_ms"] = [statistics.median(added), min(added), max(added)]
        rows.append(row)
    return rows


def open_table(rows: list[dict[str, object]]) -> str:
    """The open-loop cells: latency at a fixed rate, and what each target adds to
    ``direct``'s p99 (paired by repeat: median, min-max)."""
    lines = ["| target | rate (req/s) | ok/s | p50 ms | p99 ms | added p99 ms (min-max) | "
             "errors |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["mode"] != "open":
            continue
        added = r.get("added_p99_ms")
        shown = "-" if not isinstance(added, list) else \
            f"{added[0]:.2f} ({added[1]:.2f} to {added[2]:.2f})"
        lines.append(f"| {r['target']} | {r['connections']} | {r['ok_per_s']:,.0f} | "
                     f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {shown} | {r['errors']} |")
    return "\n".join(lines)


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| target | kind | conns | req/s (min-max) | p50 ms | p99 ms | errors | "
             "x vllm-router rr |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["ratio_to_vllm_router"]
        lines.append(f"| {r['target']} | {r['mode']} | {r['connections']} | "
                     f"{r['ok_per_s']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f}) | "
                     f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["mode"] != "open"]
    modes = sorted({str(r["mode"]) for r in rows})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for target in dict.fromkeys(str(r["target"]) for r in rows if r["target"] != "direct"):
            pts = sorted((int(r["connections"]), r) for r in rows  # type: ignore[call-overload]
                         if r["target"] == target and r["mode"] == mode)
            if not pts:
                continue
            xs = [c for c, _ in pts]
            ys = [float(r["ok_per_s"]) for _, r in pts]  # type: ignore[arg-type]
            err = [[y - float(r["min"]) for y, (_, r) in zip(ys, pts)],  # type: ignore[arg-type]
                   [float(r["max"]) - y for y, (_, r) in zip(ys, pts)]]  # type: ignore[arg-type]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=target)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("connections")
        ax.set_ylabel("successful requests/s (router on one core)")
        ax.set_title(f"{mode} chat completions")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
