"""``python -m kernels_bench status``: where hetserve stands, one row per claim, every number
read from the JSON file the row cites (the rows below name files and fields, never values).

``--write README.md`` replaces the table between the README's status markers with the one
printed; ``--check README.md`` exits 1 when the README's table differs (tests/unit/test_status.py
runs it). Needs the standard library only: no engine, no lab package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- status: python -m kernels_bench status --write README.md -->"
END = "<!-- /status -->"
KNN_RULE = 'chimera:stjf@quality="knn",latency="finish",delta_s=0.3,target_share=0.3'
"""The share-holding rule of `make replay` and of the twin's serving tests (a policy spec)."""


@dataclass(frozen=True)
class Metric:
    """One compared quantity of a replay record (``frontier_gap``'s JSON): its value and
    95% interval, ``{"value", "lo", "hi"}``."""
    field: str
    kind: Literal["points", "ratio"]
    label: str
    above: str
    """The verdict's words when the interval lies above no-difference."""
    below: str


@dataclass(frozen=True)
class Claim:
    claim: str
    setting: str
    source: str
    """The JSON file, from the repository root."""
    read: Callable[[Any], tuple[str, str]]
    """The record's number (with its interval) and verdict."""
    link: str


def _verdict(m: Metric, v: dict[str, float]) -> str:
    null = 0.0 if m.kind == "points" else 1.0
    if v["lo"] > null:
        return f"{m.above} (finding)"
    if v["hi"] < null:
        return f"{m.below} (finding)"
    return f"{m.label}: unresolved"


def _number(m: Metric, v: dict[str, float]) -> str:
    if m.kind == "points":
        return f"{v['value']:+.1f} [{v['lo']:+.1f}, {v['hi']:+.1f}] {m.label}"
    return f"{v['value']:.3f}x [{v['lo']:.3f}, {v['hi']:.3f}] {m.label}"


def replay(policy: str, *metrics: Metric) -> Callable[[Any], tuple[str, str]]:
    """The record of ``policy`` in a replay's comparison file (a list of records)."""
    def read(records: list[dict[str, Any]]) -> tuple[str, str]:
        rec = next(r for r in records if r["policy"] == policy)
        return (" at ".join(_number(m, rec[m.field]) for m in metrics),
                "; ".join(_verdict(m, rec[m.field]) for m in metrics))
    return read


def front(target: str, against: str) -> Callable[[Any], tuple[str, str]]:
    """Requests/s of ``target`` over ``against`` in each cell of a front benchmark's run."""
    def read(run: dict[str, Any]) -> tuple[str, str]:
        rate = {(r["target"], r["mode"], r["connections"]): r["ok_per_s"]
                for r in run["summary"]}
        cells = sorted((c, m) for t, m, c in rate if t == target)
        ratios = [rate[(target, m, c)] / rate[(against, m, c)] for c, m in cells]
        conns = "/".join(f"{c:,}" for c, _ in cells)
        span = f"{min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else f"{ratios[0]:.2f}x"
        verdict = ("slower in every cell" if max(ratios) < 1 else
                   "faster in every cell" if min(ratios) > 1 else "mixed")
        return (f"{span} its requests/s ({conns} connections, {run['args']['repeats']} "
                f"repeats; no interval)", f"{verdict} (measured)")
    return read


def soak(run: dict[str, Any]) -> tuple[str, str]:
    """Requests lost and the slowest route-around of a soak's run."""
    total = sum(run["outcomes"].values())
    routed = [f["routed_around_s"] for f in run["faults"] if f.get("routed_around_s") is not None]
    day = datetime.fromtimestamp(run["t_start"], UTC).date()
    met = run["outcomes"]["lost"] == 0 and max(routed) <= 2
    return (f"{run['outcomes']['lost']} of {total:,} requests lost ({run['outcomes']['ok']:,} "
            f"answered, the rest refused or failed clearly); {len(run['faults'])} faults, "
            f"engines routed around in <= {max(routed):.1f} s ({day})",
            f"target (0 lost, engines routed around within 2 s) {'met' if met else 'missed'} "
            f"(measured)")


SCORE = Metric("score_minus_baseline", "points", "points", "more points", "fewer points")
ABOVE_MIX = Metric("minus_mix_curve", "points", "points above the random-mix curve",
                   "above the curve", "below the curve")
E2E_TOKEN = Metric("e2e_per_token_ratio", "ratio", "E2E per token", "slower", "faster")
CLAIMS = [
    Claim("Learned routing vs vLLM's balancer, on workflows no predictor saw",
          "measured live: two engines on a 2-core CPU (the big model's 4.5x slower per "
          "token), math and code workflows at 3/s, Chimera on a KNN quality predictor; "
          "`make replay`, 2026-11-29",
          "docs/research/results/frontier-gap.json", replay(KNN_RULE, SCORE, E2E_TOKEN),
          "docs/research/results.md"),
    Claim("Math: learned ranking vs a random router at the same share",
          "digital twin (latency modelled from H200 step times; answers recorded from real "
          "models), 700 unseen math problems, the same Chimera; 2026-11-29",
          "docs/research/predictors/quality/serve-pooled-math-300-999.json",
          replay(KNN_RULE, ABOVE_MIX), "docs/research/predictors.md"),
    Claim("Math: learned routing vs vLLM's balancer",
          "the same twin runs",
          "docs/research/predictors/quality/serve-pooled-math-300-999.json",
          replay(KNN_RULE, SCORE, E2E_TOKEN), "docs/research/predictors.md"),
    Claim("Math: the lexical KNN vs vLLM's balancer",
          "the same twin, 400 newer math problems (an extension decided after a near miss), "
          "Chimera on a lexical KNN; 2026-11-29",
          "docs/research/predictors/quality/serve-lexical-pooled-math-800-1199.json",
          replay(KNN_RULE, SCORE, E2E_TOKEN), "docs/research/predictors.md"),
    Claim("Router HTTP front vs a bare Python pass-through",
          "measured: one core, `wrk`, round robin, whole answers; 2026-11-25",
          "docs/research/performance/front-prompt.json",
          front("hetserve:round_robin", "passthrough"), "docs/research/performance.md"),
    Claim("Router HTTP front vs vllm-router (Rust)",
          "the same run", "docs/research/performance/front-prompt.json",
          front("hetserve:round_robin", "vllm-router:round_robin"),
          "docs/research/performance.md"),
    Claim("An hour of faults: engines killed and stopped, router workers killed, launcher "
          "restarted",
          "measured: `python -m kernels_bench soak --duration-s 3600`, two router workers, "
          "16 clients", "docs/research/reliability/soak-60min-5.json", soak,
          "docs/research/soak.md"),
]


def table(root: Path = ROOT) -> str:
    """The status table, each number read now from its file."""
    lines = ["| claim | setting | number [95% interval] | verdict | source |",
             "|---|---|---|---|---|"]
    for c in CLAIMS:
        number, verdict = c.read(json.loads((root / c.source).read_text(encoding="utf-8")))
        name = Path(c.source).name
        lines.append(f"| {c.claim} | {c.setting} | {number} | {verdict} | "
                     f"[{name}]({c.source}), [page]({c.link}) |")
    return "\n".join(lines) + "\n"


def block(text: str) -> str:
    """The part of ``text`` between the status markers."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"no status markers ({BEGIN} ... {END})")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench status",
                                description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", type=Path, metavar="FILE",
                   help="replace the table between FILE's status markers (README.md)")
    g.add_argument("--check", type=Path, metavar="FILE",
                   help="exit 1 when FILE's table differs from the files' numbers")
    a = p.parse_args(argv)
    now = table()
    path = a.write or a.check
    if path is None:
        print(now, end="")
        return
    text = path.read_text(encoding="utf-8")
    try:
        old = block(text)
    except ValueError as e:
        sys.exit(f"error: {path}: {e}")
    if a.check:
        if old != now:
            sys.exit(f"{path}'s status table differs from the JSON it cites: run python -m "
                     f"kernels_bench status --write {path}")
        return
    before, rest = text.split(BEGIN, 1)
    path.write_text(f"{before}{BEGIN}\n{now}{END}{rest.split(END, 1)[1]}", encoding="utf-8")
