"""``python -m kernels_bench.lab.twin.calibrate``: the twin's two costs of a shared machine,
fitted on a live replay and a twin replay of the same runs (training problems only).

A profile is measured with the engine alone; in a live replay on a small machine the
engines share their cores with their API servers, the router and the client. Two numbers
carry that cost into the twin (one function each), refined by fixed-point steps: each step
compares a twin run made with the current values (none at first: K = 1, o = 0) with the
live one and corrects them:

- per engine entry, the slowdown K of its steps (``StepTimeModel.step_ms``):
  ``K_e <- K_e x median live TPOT / median twin TPOT`` over the calls entry e served
  (medians: a few stalled streams do not move them);
- a fixed cost per call (``RouterCosts.request_overhead_s``): HTTP, the API server's
  tokenization and first chunk: ``o <- max(0, o + median live TTFT - median twin TTFT)``.

Fit on runs of training problems (``replay --problems trained``), then compare on the
held-out ones: never fit on what is evaluated.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernels_bench.lab.replay.metrics import tpot, ttft
from kernels_bench.lab.replay.output import load_summary, read_jsonl
from kernels_bench.lab.replay.records import RequestRecord, from_row

MIN_CALLS = 20
"""Fewest calls per engine entry a slowdown is fitted on."""


def _calls(rows: Iterable[Mapping[str, Any]]) -> list[RequestRecord]:
    """The calls of ``requests.jsonl`` rows that did not fail."""
    calls = (from_row(RequestRecord, row) for row in rows)
    return [r for r in calls if r.error is None]


def entry_of(engine: str, entries: Iterable[str]) -> str | None:
    """The cluster entry of an engine instance (``tiny-a-0`` -> ``tiny-a``)."""
    for e in sorted(entries, key=len, reverse=True):
        if engine == e or engine.startswith(f"{e}-"):
            return e
    return None


def slowdowns(live: Sequence[RequestRecord], twin: Sequence[RequestRecord],
              entries: Sequence[str], used: Mapping[str, float]) -> dict[str, float]:
    """``K_e = used K_e x median live TPOT / median twin TPOT`` per entry e (TPOT:
    ``replay.metrics.tpot``; ValueError: too few calls)."""
    out = {}
    for e in entries:
        values = []
        for calls in (live, twin):
            xs = [t for r in calls if entry_of(r.engine, entries) == e
                  and (t := tpot(r)) is not None]
            if len(xs) < MIN_CALLS:
                raise ValueError(f"engine {e}: {len(xs)} calls with a TPOT, at least "
                                 f"{MIN_CALLS} are needed")
            values.append(statistics.median(xs))
        out[e] = used.get(e, 1.0) * values[0] / values[1]
    return out


def request_overhead_s(live: Sequence[RequestRecord], twin: Sequence[RequestRecord],
                       used_s: float) -> float:
    """``o = max(0, used o + median live TTFT - median twin TTFT)`` (``replay.metrics.ttft``)."""
    live_ttft = [t for r in live if (t := ttft(r)) is not None]
    twin_ttft = [t for r in twin if (t := ttft(r)) is not None]
    if not live_ttft or not twin_ttft:
        raise ValueError("no call with a first token in one of the replays")
    return max(0.0, used_s + statistics.median(live_ttft) - statistics.median(twin_ttft))


def calibration(live_dir: Path, twin_dir: Path) -> dict[str, Any]:
    """The fitted costs, over the (policy, rate, repeat) runs both folders hold."""
    live_meta, twin_meta = load_summary(live_dir)["meta"], load_summary(twin_dir)["meta"]
    if live_meta.get("problems") != "trained" or twin_meta.get("problems") != "trained":
        raise ValueError("replays of training problems are needed (--problems trained), "
                         "never the evaluated ones")
    if "twin" not in twin_meta:
        raise ValueError(f"{twin_dir}: not a twin replay")
    used = twin_meta["twin"]
    rows = [read_jsonl(d / "requests.jsonl") for d in (live_dir, twin_dir)]
    runs = set.intersection(*({(r["policy"], r["rate"]) for r in rs} for rs in rows))
    if not runs:
        raise ValueError("the two replays share no (policy, rate) run")
    live, twin = (_calls(r for r in rs if (r["policy"], r["rate"]) in runs) for rs in rows)
    entries = [e["name"] for e in live_meta["engines"]]
    k = slowdowns(live, twin, entries, used.get("slowdown") or {})
    overhead = request_overhead_s(live, twin, used["request_overhead_ms"] / 1e3)
    return {"slowdown": k, "request_overhead_ms": 1e3 * overhead,
            "fitted_on": {"live": live_meta["command"], "twin": twin_meta["command"],
                          "runs": sorted(f"{p} @ {r:g}/s" for p, r in runs)}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.calibrate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--live", type=Path, required=True, help="a live replay's folder "
                   "(--problems trained)")
    p.add_argument("--twin", type=Path, required=True, help="the twin replay of the same "
                   "command (uncalibrated, or with the previous step's --calibration)")
    p.add_argument("--out", type=Path, required=True, help="calibration JSON, for "
                   "kernels_bench twin --calibration")
    a = p.parse_args(argv)
    try:
        cal = calibration(a.live, a.twin)
    except (ValueError, OSError, KeyError) as e:
        raise SystemExit(f"error: {e}") from None
    a.out.write_text(json.dumps(cal, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in cal.items() if k != "fitted_on"}, indent=2))


if __name__ == "__main__":
    main()
