"""``python -m kernels_bench soak``: its options, table, plot and files (the harness:
``faults.soak``)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from kernels_bench.lab.faults import soak
from kernels_bench.lab.faults.soak import DEFAULT_CLUSTER, ROUTER_GAUGES, run

OUTCOME_COLUMNS = ("ok", "error", "refused", "cut", "lost", "abandoned")
ENGINE_FAULTS = ("kill-engine", "stop-engine")
"""The faults an engine suffers, which the router must route around."""
MAX_SECONDS = 7 * 86400.0
"""The longest duration, timeout or interval a flag takes (a week)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels_bench soak",
                                     description=soak.__doc__.split("\n")[0])
    parser.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER,
                        help="cluster file (loopback; at least two engine instances)")
    parser.add_argument("--duration-s", type=float, default=600.0,
                        help="how long the load runs; no fault starts in its last "
                        "--settle-s")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--settle-s", type=float, default=20.0,
                        help="load before the first fault and after each recovery")
    parser.add_argument("--sample-s", type=float, default=5.0,
                        help="interval between samples of every process")
    parser.add_argument("--recovery-timeout-s", type=float, default=300.0,
                        help="a fault's target not back after this long counts as not "
                        "back (the soak then waits up to --start-timeout-s for it)")
    parser.add_argument("--request-timeout-s", type=float, default=120.0,
                        help="a client's timeout (then the request counts as lost)")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--only", action="append", choices=soak.SCHEDULE, metavar="FAULT",
                        help="only this fault of the schedule (repeatable; default: all of "
                        f"{', '.join(soak.SCHEDULE)}, in that order)")
    parser.add_argument("--out", type=Path, default=Path("bench_results/soak"),
                        help="directory for soak.json and soak.png")
    args = parser.parse_args(argv)
    if not 1 <= args.concurrency <= 1024:
        parser.error("--concurrency: 1 to 1024")
    for name in ("duration_s", "settle_s", "sample_s", "recovery_timeout_s",
                 "request_timeout_s", "start_timeout_s"):
        if not 0 < getattr(args, name) <= MAX_SECONDS:  # NaN fails too
            parser.error(f"--{name.replace('_', '-')}: above 0, at most {MAX_SECONDS:.0f} s")
    try:
        with tempfile.TemporaryDirectory(prefix="hs-soak-", dir="/tmp") as tmp:
            result = run(args, Path(tmp))
    except RuntimeError as exc:
        sys.exit(f"soak: {exc}")
    print()
    print("\n".join(result["launcher_events"]))  # type: ignore[arg-type]
    print()
    print(table(result))
    print()
    print(by_kind(result))
    print()
    print(trends(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "soak.png")
    print(f"\nwrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")


def _secs(v: float | None) -> str:
    return "not back" if v is None else f"{v:.1f} s"


def _at(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(result: dict) -> str:
    """One row per fault: what ended in its window (and how much of it its client sent
    twice: unsent, unanswered), routed around (and, for engine faults, when each worker's
    last snapshot of the engine was sent and read, from the fault), back."""
    lines = ["| t (s) | fault | target | " + " | ".join(OUTCOME_COLUMNS)
             + " | resent | resent unanswered | routed around | back |",
             "|---|---|---|" + "---|" * len(OUTCOME_COLUMNS) + "---|---|---|---|"]
    o = result["steady"]
    lines.append("| 0 | (steady) | - | " + " | ".join(str(o[c]) for c in OUTCOME_COLUMNS)
                 + f" | {result['steady_resent']} | {result.get('steady_resent_unanswered', 0)}"
                 " | - | - |")
    for f in result["faults"]:
        o = f["outcomes"]
        around = "-" if f["routed_around_s"] is None else f"{f['routed_around_s']:.2f} s"
        if f.get("worker_down_s"):
            around += " (workers " + ", ".join(_at(d) for d in f["worker_down_s"])
            if f.get("worker_last_sent_s"):  # the engine's last snapshot, per worker
                around += "; their last snapshot sent " + ", ".join(
                    _at(d) for d in f["worker_last_sent_s"]) + ", read " + ", ".join(
                    _at(d) for d in f["worker_last_received_s"])
            around += f"; launcher {_at(f.get('launcher_saw_s'))})"
        lines.append(f"| {f['at'] - result['t_start']:.0f} | {f['kind']} | {f['target']} | "
                     + " | ".join(str(o[c]) for c in OUTCOME_COLUMNS)
                     + f" | {f['resent']} | {f.get('resent_unanswered', 0)} | {around} | "
                     f"{_secs(f['back_s'])} |")
    o = result["outcomes"]
    lines.append("| | **total** | | " + " | ".join(f"**{o[c]}**" for c in OUTCOME_COLUMNS)
                 + f" | **{result['resent']}** | **{result.get('resent_unanswered', 0)}** | | |")
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    """``min / median / max`` of ``values`` in seconds, ``-`` when there are none."""
    if not values:
        return "-"
    v = sorted(values)
    return f"{v[0]:.2f} / {statistics.median(v):.2f} / {v[-1]:.2f} s"


def by_kind(result: dict) -> str:
    """One row per kind of fault: how often, what ended in its windows, how many of its
    engine faults were routed around within 2 s (issue 35's bar), and routed around and
    back as min / median / max (a target never back counts in ``not back``)."""
    lines = ["| fault | times | " + " | ".join(OUTCOME_COLUMNS)
             + " | routed around <= 2 s | routed around | back | not back |",
             "|---|---|" + "---|" * len(OUTCOME_COLUMNS) + "---|---|---|---|"]
    for kind in dict.fromkeys(f["kind"] for f in result["faults"]):
        faults = [f for f in result["faults"] if f["kind"] == kind]
        around = [f["routed_around_s"] for f in faults if f["routed_around_s"] is not None]
        back = [f["back_s"] for f in faults if f["back_s"] is not None]
        within = (f"{sum(a <= 2.0 for a in around)} of {len(faults)}"
                  if kind in ENGINE_FAULTS else "-")
        lines.append(f"| {kind} | {len(faults)} | "
                     + " | ".join(str(sum(f["outcomes"][c] for f in faults))
                                  for c in OUTCOME_COLUMNS)
                     + f" | {within} | {_spread(around)} | {_spread(back)} | "
                     f"{len(faults) - len(back)} |")
    return "\n".join(lines)


def _series(result: dict, process: str, source: str, key: str) -> list[tuple[float, float]]:
    return [(s["t"] - result["t_start"], float(s[key])) for s in result["samples"]
            if s["process"] == process and s["source"] == source and s.get(key) is not None]


def trends(result: dict, after_s: float = 300.0) -> str:
    """Per process and quantity: the first sample after ``after_s`` (or the first one),
    the last, min and max."""
    lines = ["| process | quantity | at 5 min | end | min | max |", "|---|---|---|---|---|---|"]
    keys = sorted({(s["process"], s["source"]) for s in result["samples"]})
    for process, source in keys:
        for key in ("rss_bytes", "fds") if source == "psutil" else ROUTER_GAUGES:
            pts = _series(result, process, source, key)
            if not pts:
                continue
            ref = next((v for t, v in pts if t >= after_s), pts[0][1])
            vals = [v for _, v in pts]
            fmt = (lambda v: f"{v / 2**20:.0f} MiB") if key == "rss_bytes" else \
                (lambda v: f"{v:.0f}")
            lines.append(f"| {process} ({source}) | {key} | {fmt(ref)} | {fmt(vals[-1])} | "
                         f"{fmt(min(vals))} | {fmt(max(vals))} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Every sampled quantity over time, one panel each, faults as vertical lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("psutil", "rss_bytes", "RSS (MiB), psutil"), ("psutil", "fds", "open fds"),
              ("metrics", "tasks", "asyncio tasks (router)"),
              ("metrics", "programs", "program table (router)"),
              ("metrics", "kv_index_blocks", "KV index blocks (router)"),
              ("metrics", "ledger", "in-flight ledger (router)")]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(11, 2.2 * (len(panels) + 1)),
                             sharex=True)
    processes = sorted({s["process"] for s in result["samples"]})
    color = {p: f"C{i}" for i, p in enumerate(processes)}
    for ax, (source, key, title) in zip(axes, panels):
        for process in processes:
            pts = _series(result, process, source, key)
            if pts:
                scale = 2**20 if key == "rss_bytes" else 1
                ax.plot([t for t, _ in pts], [v / scale for _, v in pts], label=process,
                        lw=1, marker=".", ms=2, color=color[process])
        ax.set_ylabel(title, fontsize=8)
    axes[0].legend(fontsize=7, ncol=4, loc="upper left")
    ax = axes[-1]
    width = result["timeline_s"]
    bins = sorted(int(k) for k in result["timeline"])
    for outcome, color in (("ok", "tab:green"), ("refused", "tab:orange"),
                           ("cut", "tab:red"), ("error", "tab:purple"), ("lost", "black")):
        ax.plot([b * width for b in bins],
                [result["timeline"][str(b)].get(outcome, 0) / width for b in bins],
                label=outcome, color=color, lw=1)
    ax.set_yscale("symlog")
    ax.legend(fontsize=7, ncol=5, loc="upper left")
    ax.set_ylabel(f"requests/s ended\n({width:g} s bins)", fontsize=8)
    ax.set_xlabel("seconds since the load started")
    colors = {"kill-engine": "black", "stop-engine": "tab:purple",
              "kill-router-worker": "tab:orange", "restart-launcher": "tab:green"}
    for a in axes:
        for f in result["faults"]:
            a.axvline(f["at"] - result["t_start"], color=colors.get(f["kind"], "grey"),
                      lw=0.8, ls="--")
    fig.suptitle(f"soak: {result['duration_s']:g} s, {result['concurrency']} clients; "
                 "dashed: kill-engine (black), stop-engine (purple), kill-router-worker "
                 "(orange), restart-launcher (green)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
