"""What sampled decoding costs on one engine, against greedy (issue 30, docs/research/traces.md).

    python -m kernels_bench.lab.studies.sampling_cost [--cluster data/traces/qwen-cpu.toml]
        [--engine qwen2.5-coder-0.5b-instruct] [--settings greedy p95 p100 k50 ...]
        [--rounds 3] [--batch 32] [--max-tokens 256] [--budget-min 13]
        [--out artifacts/sampling-cost/qwen2.5-coder-0.5b-instruct.json]

Starts one engine of the cluster file exactly as ``trace build --samples K`` does
(``kernels_bench.lab.trace.engines.engine_session(..., seeded=True)``: the launcher's command,
placement and environment; on a machine without GPUs unchunked prefill,
``--no-enable-chunked-prefill`` and ``max_num_batched_tokens`` >= ``max_model_len``), then
runs rounds; a round sends, for every sampling setting in turn (the order rotated by one
each round), one batch of ``--batch`` chat completions at once (the build's concurrency).
Every batch holds the same prompts: the first stages of the first ``--batch`` (problem,
workflow) runs of the engine's model in ``--trace`` (the system prompt and user turn the
build sent), ``max_tokens`` ``--max-tokens`` and ``ignore_eos`` so every request decodes
the same number of tokens. Seeded settings send the build's per-request seed
(``stage_seed(sample_seed(0, problem, workflow, model, round), 0)``).

Measured per batch: ``tok_s``, output tokens over the batch's wall time (first request
sent to last answer: prefill of the 32 prompts included, the rate a build sees) and
``decode_tok_s``, output tokens after each request's first over the mean per-request
decode time (the engine's ``vllm:request_decode_time_seconds`` histogram, before and after
the batch). Reported per setting: the mean over rounds and the ratio to greedy paired by
round (geometric mean of the per-round ratios, with a 95% t interval on their logs).

Resumable: results are written to ``--out`` after every batch; rerunning the same command
skips the batches already there and adds rounds up to ``--rounds``. ``--budget-min`` stops
before a round that would not end within that many minutes of the engine's start (for a
shared machine's lock). ``--report`` prints the table of an existing ``--out`` and starts
nothing. Before the first round, unmeasured: one full batch of 16 greedy tokens (the
prompts then sit in the prefix cache, so every measured batch's prefill is mostly cached)
and one short request per setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from router.trace_format import load_trace, sample_seed, stage_seed

ROOT = Path(__file__).resolve().parents[3]
"""The repository (the default cluster, trace and output paths are in it)."""

# name -> (request fields, seeded). top_p 1.0 / top_k -1 are vLLM's "off".
SETTINGS: dict[str, tuple[dict[str, Any], bool]] = {
    "greedy": ({"temperature": 0.0}, False),
    "p95": ({"temperature": 0.7, "top_p": 0.95}, True),  # the trace build's default
    "p100": ({"temperature": 0.7, "top_p": 1.0}, True),
    "p100-noseed": ({"temperature": 0.7, "top_p": 1.0}, False),
    "k50": ({"temperature": 0.7, "top_p": 1.0, "top_k": 50}, True),
    "minp05": ({"temperature": 0.7, "top_p": 1.0, "min_p": 0.05}, True),
    "p95-noseed": ({"temperature": 0.7, "top_p": 0.95}, False),
}
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228}


def first_stages(trace: Path, model: str, n: int) -> list[tuple[str, str, list[dict]]]:
    """(problem_id, workflow, messages) of the first stage of ``n`` greedy runs of
    ``model`` (sorted by problem, then workflow)."""
    runs = sorted((r for r in load_trace(trace).runs if model in r.models),
                  key=lambda r: (r.problem_id, r.workflow))
    if len(runs) < n:
        raise SystemExit(f"{trace}: only {len(runs)} runs of {model}, --batch {n}")
    return [(r.problem_id, r.workflow,
              [{"role": m.role, "content": m.content} for m in r.models[model].stages[0].messages])
            for r in runs[:n]]


def decode_metrics(client: httpx.Client, url: str) -> tuple[float, float]:
    """(sum, count) of the engine's per-request decode time histogram."""
    text = client.get(f"{url}/metrics", timeout=30.0).text
    out = {"sum": 0.0, "count": 0.0}
    for m in re.finditer(r"^vllm:request_decode_time_seconds_(sum|count)(?:\{[^}]*\})? "
                         r"([0-9.eE+-]+)$", text, re.M):
        out[m[1]] += float(m[2])
    return out["sum"], out["count"]


async def one_batch(url: str, model: str, prompts: list, setting: str, round_: int,
                    max_tokens: int) -> tuple[int, float]:
    fields, seeded = SETTINGS[setting]

    async def call(client: httpx.AsyncClient, pid: str, wf: str, messages: list) -> int:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens,
                "ignore_eos": True, **fields}
        if seeded:
            body["seed"] = stage_seed(sample_seed(0, pid, wf, model, round_), 0)
        elif fields["temperature"] == 0.0:
            body["seed"] = 0  # as the build's greedy runs (no generator at temperature 0)
        r = await client.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:
        t0 = time.perf_counter()
        toks = await asyncio.gather(*(call(client, *p) for p in prompts))
        return sum(toks), time.perf_counter() - t0


def summarize(res: dict) -> str:
    rows = {}
    for b in res["batches"]:
        rows.setdefault(b["setting"], {})[b["round"]] = b
    greedy = rows.get("greedy", {})
    lines = [f"{res['engine']}: batch {res['batch']}, max_tokens {res['max_tokens']} "
             "(ignore_eos); tok/s = output tokens / batch wall time; decode = after "
             "first tokens / mean decode time; step ms = batch / decode rate (one decode step of "
             "the full batch); ratio = setting / greedy, paired by round, "
             "geometric mean [95% t interval]; step - greedy: the decode step's extra "
             "time, paired by round, mean [95% t interval]",
             f"{'setting':<12} {'rounds':>6} {'tok/s':>7} {'decode':>7} {'step ms':>7} "
             f"{'ratio tok/s':>24} {'ratio decode':>24} {'step - greedy ms':>20}"]
    for name in [s for s in SETTINGS if s in rows]:
        bs = rows[name]
        mean = sum(b["tok_s"] for b in bs.values()) / len(bs)
        dmean = sum(b["decode_tok_s"] for b in bs.values()) / len(bs)
        cells = []
        diffs = [1000 * res["batch"] * (1 / b["decode_tok_s"] - 1 / greedy[r]["decode_tok_s"])
                 for r, b in bs.items() if r in greedy]
        if name != "greedy" and len(diffs) > 1:
            m = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1))
            h = T975.get(len(diffs) - 1, 1.96) * sd / math.sqrt(len(diffs))
            extra = f"{m:+.0f} [{m - h:+.0f}, {m + h:+.0f}]"
        else:
            extra = f"{diffs[0]:+.0f}" if name != "greedy" and diffs else ""
        for key in ("tok_s", "decode_tok_s"):
            logs = [math.log(b[key] / greedy[r][key]) for r, b in bs.items() if r in greedy]
            if name == "greedy" or not logs:
                cells.append("")
                continue
            m = sum(logs) / len(logs)
            if len(logs) > 1:
                sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
                h = T975.get(len(logs) - 1, 1.96) * sd / math.sqrt(len(logs))
                cells.append(f"{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]")
            else:
                cells.append(f"{math.exp(m):.3f}")
        step = sum(1000 * res["batch"] / b["decode_tok_s"] for b in bs.values()) / len(bs)
        lines.append(f"{name:<12} {len(bs):>6} {mean:>7.2f} {dmean:>7.2f} {step:>7.0f} "
                     f"{cells[0]:>24} {cells[1]:>24} {extra:>20}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", type=Path, default=ROOT / "data/traces/qwen-cpu.toml")
    ap.add_argument("--engine", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--trace", type=Path, default=ROOT / "data/traces/math.jsonl.gz",
                    help="prompts: the first stages of this trace's greedy runs")
    ap.add_argument("--settings", nargs="+", default=["greedy", "p95", "p100", "k50"],
                    choices=list(SETTINGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="requests in flight (build: 32)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--budget-min", type=float, default=0.0,
                    help="start no round that would end later than this many minutes "
                         "after the engine's start (0: no limit)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results (default artifacts/sampling-cost/<engine>.json)")
    ap.add_argument("--report", action="store_true", help="print --out's table and exit")
    a = ap.parse_args()
    if a.rounds < 1 or a.batch < 1 or a.max_tokens < 1 or a.budget_min < 0:
        ap.error("--rounds, --batch and --max-tokens must be at least 1, --budget-min >= 0")
    out = a.out or ROOT / "artifacts/sampling-cost" / f"{a.engine}.json"
    config = {"engine": a.engine, "batch": a.batch, "max_tokens": a.max_tokens,
              "trace": a.trace.name}
    res: dict[str, Any] = {**config, "batches": []}
    if out.exists():
        old = json.loads(out.read_text())
        if {k: old.get(k) for k in config} != config:
            raise SystemExit(f"{out} was measured with {({k: old.get(k) for k in config})}; "
                             "use another --out")
        res = old
    if a.report:
        print(summarize(res))
        return

    from kernels_bench.lab.trace.engines import engine_session, single_engine_config

    cfg = single_engine_config(a.cluster, a.engine)
    model = cfg.engine(a.engine).served_model_name
    prompts = first_stages(a.trace, model, a.batch)
    done = {(b["round"], b["setting"]) for b in res["batches"]}
    todo_rounds = [r for r in range(a.rounds)
                   if any((r, s) not in done for s in a.settings)]
    if not todo_rounds:
        print(summarize(res))
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    with engine_session(cfg, a.engine, seeded=True) as eng, httpx.Client() as sync:
        res.setdefault("engine_started_after_s", round(time.monotonic() - t_start, 1))
        # Warm-up, not measured: a full batch (in the pilot the first full batch after
        # the start decoded about 20% slower than later greedy batches; the prompts then
        # also sit in the prefix cache), then every setting's path once.
        asyncio.run(one_batch(eng.base_url, model, prompts, "greedy", 999, 16))
        for s in a.settings:
            asyncio.run(one_batch(eng.base_url, model, prompts[:1], s, 999, 4))
        bar = tqdm(total=len(todo_rounds) * len(a.settings), unit="batch")
        round_s: list[float] = []
        for r in todo_rounds:
            elapsed = (time.monotonic() - t_start) / 60
            guess = max(round_s, default=0.0) / 60
            if a.budget_min and round_s and elapsed + guess > a.budget_min:
                tqdm.write(f"stopping before round {r}: {elapsed:.1f} min used, a round "
                           f"takes about {guess:.1f}, budget {a.budget_min:g}")
                break
            t_round = time.monotonic()
            k = r % len(a.settings)
            for s in a.settings[k:] + a.settings[:k]:
                if (r, s) in done:
                    bar.update()
                    continue
                d0 = decode_metrics(sync, eng.base_url)
                toks, wall = asyncio.run(one_batch(eng.base_url, model, prompts, s, r,
                                                   a.max_tokens))
                d1 = decode_metrics(sync, eng.base_url)
                n = d1[1] - d0[1]
                mean_decode = (d1[0] - d0[0]) / n if n else float("nan")
                res["batches"].append({
                    "round": r, "setting": s, "request": SETTINGS[s][0],
                    "seeded": SETTINGS[s][1], "output_tokens": toks,
                    "wall_s": round(wall, 3), "tok_s": round(toks / wall, 3),
                    "mean_decode_s": round(mean_decode, 3),
                    "decode_tok_s": round((toks - a.batch) / mean_decode, 3)})
                out.write_text(json.dumps(res, indent=1) + "\n")
                bar.set_postfix(setting=s, tok_s=f"{toks / wall:.1f}")
                bar.update()
            round_s.append(time.monotonic() - t_round)
        bar.close()
    print(summarize(res))


if __name__ == "__main__":
    main()
