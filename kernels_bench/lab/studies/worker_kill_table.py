"""The worker-kill table of docs/reliability.md from soak results (issue 35).

    python -m kernels_bench.lab.studies.worker_kill_table NAME=SOAK_JSON [NAME=SOAK_JSON ...]

Each SOAK_JSON is the ``soak.json`` of ``python -m kernels_bench soak --only
kill-router-worker``. Per run: the kills, the requests refused, the requests cut split by
when their client sent them (before the kill of the window they ended in: in flight on
the killed worker, the only ones issue 35 allows; or after it), lost, resent (``unsent``),
resent unanswered (and of those, how many were sent after the kill and how many then ended
ok, or abandoned by a client that meant to), and ok. Files from before
``resent_unanswered`` existed count it as 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(name: str, result: dict) -> str:
    starts = [f["at"] for f in result["faults"]]

    def kill_of(t: float) -> float | None:
        before = [s for s in starts if s <= t]
        return before[-1] if before else None

    in_flight = after = 0
    for c in result["not_ok"]:
        if c["outcome"] != "cut":
            continue
        kill = kill_of(c["ended"])
        if kill is None:
            continue
        if c["sent"] < kill:
            in_flight += 1
        else:
            after += 1
    unanswered = [c for c in result["not_ok"] if c.get("resent_unanswered")]
    late = sum(1 for c in unanswered if (k := kill_of(c["ended"])) is not None
               and c["sent"] >= k)
    ok = sum(1 for c in unanswered if c["outcome"] in ("ok", "abandoned"))
    o = result["outcomes"]
    return (f"| {name} | {len(starts)} | {o['refused']} | {in_flight} | {after} | {o['lost']} "
            f"| {result['resent']} | {result.get('resent_unanswered', 0)} ({late} sent after "
            f"the kill, {ok} then ok) | {o['ok']:,} |")


def main(argv: list[str]) -> None:
    if not argv or any("=" not in a for a in argv):
        sys.exit(__doc__)
    print("| run | kills | refused | cut: in flight at the kill | cut: sent after the kill "
          "| lost | resent | resent unanswered | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arg in argv:
        name, path = arg.split("=", 1)
        print(row(name, json.loads(Path(path).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
