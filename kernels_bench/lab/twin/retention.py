"""``python -m kernels_bench.lab.twin.retention [DIR...] [--pool DIR...] [--baseline SPEC]
[--plot PNG]``: what KV
retention between a program's calls buys, per replay folder (twin, or live with cached
tokens per call), policy and rate, with 95% intervals.

Per workflow (errors left out, as everywhere), from its calls (``requests.jsonl``):

- prefix hit rate of stage k: cached / prompt tokens of its stage-k calls;
- recomputed prefix tokens (``--context chat`` replays only, where each prompt extends
  the previous stage's): over the calls after the first stage, the previous call's prompt
  tokens in full blocks (the engines' block size: what the replay recorded of them,
  else ``--block-size``) that the call did not find cached: what was
  in the engine's cache when the program left and had to be computed again;
  and of it, what was recomputed on the engine of the previous call (what LRU evicted
  there: all retention can save; the rest follows a call the router *moved* to another
  engine);
- calls moved: calls after the first stage that the router sent to another engine than
  the previous stage's call;
- recomputed prompt tokens: prompt tokens not found in the prefix cache, over the calls
  of stages after the first (the first stage's context is new in every arm);
- TTFT of later stages: mean TTFT of its calls after the first stage;
- E2E (``e2e_s``), and E2E less the tool gaps the client waited (the part an engine can
  change).

A twin replay also reports, per policy and rate, what the engines' retention and admission
did (summed over engines: programs released by reason, calls not protected, calls admitted
first by program-aware admission; ``twin.retention`` of each run's summary).

Each is a mean over workflows with the replay's paired bootstrap over repeats and
workflows (``replay.intervals``); every other spec is compared with the baseline: a ratio
(tokens, times) or a difference in points (hit rates), a *finding* when its interval
excludes no-difference, else *unresolved*.

``--pool``: the folders are one replay run at several seeds (same specs, rates, gaps and
context): each folder's runs count as repeats, so the bootstrap resamples the seeds as
well as the workflows (a twin run without jitter or charged decisions repeats exactly, so
seeds, not repeats, are what varies it). Workflow ``wNNNN`` of one seed and of another are
different problems; the draw takes the same index in each, which is sound for the mean.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernels_bench.lab.replay import intervals as iv
from kernels_bench.lab.replay.output import load_summary

Calls = list[Mapping[str, Any]]
"""One workflow's calls (rows of ``requests.jsonl``)."""
DEFAULT_BLOCK_SIZE = 16
"""The engines' KV block size when neither the replay recorded it (folders written before
runs kept ``block_sizes``) nor ``--block-size`` says it (vLLM's on GPUs)."""


def _ttft(r: Mapping[str, Any]) -> float | None:
    return None if r["first_token_s"] is None else r["first_token_s"] - r["send_s"]


def _hit(stage: int) -> Callable[[Calls], float | None]:
    def value(calls: Calls) -> float | None:
        mine = [r for r in calls if r["stage_index"] == stage and r.get("cached_tokens")
                is not None]
        prompt = sum(r["prompt_tokens"] for r in mine)
        return 100.0 * sum(r["cached_tokens"] for r in mine) / prompt if prompt else None
    return value


def recomputed(calls: Calls) -> float | None:
    """Prompt tokens computed (not cached) over the calls after the first stage."""
    later = [r for r in calls if r["stage_index"] > 0]
    if not later or any(r.get("cached_tokens") is None for r in later):
        return None
    return float(sum(r["prompt_tokens"] - r["cached_tokens"] for r in later))


def _after_previous(calls: Calls) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]] | None:
    """(previous call, call) for the calls after the first stage whose previous stage ran
    (each attempt's stages in order); None when a later call has no cached count."""
    by_place = {(r["attempt"], r["stage_index"]): r for r in calls}
    later = [r for r in calls if r["stage_index"] > 0]
    if not later or any(r.get("cached_tokens") is None for r in later):
        return None
    return [(prev, r) for r in later
            if (prev := by_place.get((r["attempt"], r["stage_index"] - 1))) is not None]


def recomputed_prefix(calls: Calls, block_size: int, moved: bool | None = None
                      ) -> float | None:
    """The previous call's prompt tokens, in full blocks, that the calls after the first
    stage did not find cached. ``moved``: only the calls the router sent to another
    engine than the previous call's (True; that engine never had the prefix) or to the
    same one (False; what LRU evicted there, all retention can save)."""
    pairs = _after_previous(calls)
    if pairs is None:
        return None
    total = 0
    for prev, r in pairs:
        if moved is None or moved == (prev.get("engine") != r.get("engine")):
            prefix = min(prev["prompt_tokens"], r["prompt_tokens"]) // block_size * block_size
            total += max(0, prefix - r["cached_tokens"])
    return float(total)


def moved_calls(calls: Calls) -> float | None:
    """Calls after the first stage that the router sent to another engine than the
    previous stage's call."""
    pairs = _after_previous(calls)
    return None if pairs is None else float(sum(prev.get("engine") != r.get("engine")
                                                for prev, r in pairs))


def later_ttft(calls: Calls) -> float | None:
    """Mean TTFT of the calls after the first stage."""
    ts = [t for r in calls if r["stage_index"] > 0 and (t := _ttft(r)) is not None]
    return sum(ts) / len(ts) if ts else None


@dataclass(frozen=True)
class Metric:
    key: str
    name: str
    value: Callable[[Calls, Mapping[str, Any]], float | None]
    """Its value for one workflow: its calls and its row of ``workflows.jsonl``."""
    difference: bool = False
    fmt: str = "{:.2f}"
    ratio_fmt: str = "{:.3f}"
    """How its comparison shows (a difference: ``{:+.1f}`` points)."""


def metrics(stages: int, block_size: int | None) -> list[Metric]:
    """The table's metrics for workflows of up to ``stages`` stages; ``block_size``: the
    engines' (a chat-context replay), None: no recomputed-prefix metric."""
    prefix = [] if block_size is None else [
        Metric("recomputed_prefix", "recomputed prefix tokens / wf",
               lambda c, w: recomputed_prefix(c, block_size), fmt="{:.0f}"),
        Metric("recomputed_prefix_same", "of which on the same engine",
               lambda c, w: recomputed_prefix(c, block_size, moved=False), fmt="{:.0f}"),
        Metric("moved", "calls moved / wf", lambda c, w: moved_calls(c))]
    return [
        *(Metric(f"hit.{k}", f"hit % stage {k}", lambda c, w, h=_hit(k): h(c), True, "{:.1f}")
          for k in range(stages)),
        *prefix,
        Metric("recomputed", "recomputed prompt tokens / wf", lambda c, w: recomputed(c),
               fmt="{:.0f}"),
        Metric("ttft_later", "TTFT stages > 0 (s)", lambda c, w: later_ttft(c), fmt="{:.3f}"),
        Metric("e2e", "E2E (s)", lambda c, w: w["end_s"] - w["arrival_s"],
               ratio_fmt="{:.4f}"),
        Metric("e2e_less_gaps", "E2E less gaps (s)", lambda c, w: w["end_s"] - w["arrival_s"]
               - sum(r.get("tool_gap_s") or 0.0 for r in c), ratio_fmt="{:.4f}"),
    ]


def _rows(folder: Path, name: str) -> list[dict[str, Any]]:
    path = folder / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"{folder}: no {name}.jsonl (not a replay folder)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


POOLED_META = ("baseline", "tool_gap", "context", "workflows", "problems", "arrival")
"""What the folders pooled as seeds of one replay must agree on (``summary.json`` meta)."""


def pooled(folders: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                               list[dict[str, Any]], dict[str, Any]]:
    """Requests, workflows and runs of ``folders`` as one replay whose repeat ``k`` is
    the ``k``-th (folder, repeat) pair, and the first folder's meta with ``seeds`` (every
    folder's); ValueError when the folders are not the same setup."""
    summaries = [load_summary(f) for f in folders]
    meta = summaries[0]["meta"]
    for f, s in zip(folders[1:], summaries[1:]):
        differ = [k for k in POOLED_META if s["meta"].get(k) != meta.get(k)]
        if differ:
            raise ValueError(f"{f}: not the setup of {folders[0]} ({', '.join(differ)} differ)"
                             "; --pool pools the seeds of one replay")
    if len({s["meta"].get("seed") for s in summaries}) < len(folders):
        raise ValueError("--pool: two folders ran the same seed (a twin run repeats exactly)")
    requests, flows, runs = [], [], []
    at: dict[tuple[int, int], int] = {}
    for i, (f, s) in enumerate(zip(folders, summaries)):
        def repeat(row: Mapping[str, Any], i: int = i) -> int:
            return at.setdefault((i, row.get("repeat", 0)), len(at))
        requests += [{**r, "repeat": repeat(r)} for r in _rows(f, "requests")]
        flows += [{**w, "repeat": repeat(w)} for w in _rows(f, "workflows")]
        runs += s.get("runs", [])
    return requests, flows, runs, {**meta, "seeds": [s["meta"].get("seed") for s in summaries]}


def recorded_block_size(runs: Sequence[Mapping[str, Any]]) -> int | None:
    """The engines' KV block size the replay recorded (each run's ``block_sizes``); None
    when no run recorded one; ValueError when engines differ."""
    sizes = {b for r in runs for b in (r.get("block_sizes") or {}).values() if b}
    if len(sizes) > 1:
        raise ValueError(f"the replay's engines have different KV block sizes "
                         f"({', '.join(map(str, sorted(sizes)))}): recomputed prefix tokens "
                         "need one; analyse their runs apart")
    return sizes.pop() if sizes else None


def analyse(folder: Path | Sequence[Path], baseline: str | None = None,
            block_size: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Values and comparisons of one replay folder, or of several pooled as the seeds
    of one replay (``pooled``; counters summed over them) (JSON-ready). ``block_size``:
    the engines' KV block size where the replay did not record it (default
    ``DEFAULT_BLOCK_SIZE``); ValueError where it recorded another."""
    folders = [folder] if isinstance(folder, Path) else list(folder)
    if len(folders) == 1:
        summary = load_summary(folders[0])
        meta, run_rows = summary["meta"], summary.get("runs", [])
        meta = {**meta, "seeds": [meta.get("seed")]}
        request_rows, flow_rows = _rows(folders[0], "requests"), _rows(folders[0], "workflows")
    else:
        request_rows, flow_rows, run_rows, meta = pooled(folders)
    base = baseline or meta["baseline"]
    context = meta.get("context", "trace")
    calls: dict[tuple[str, float, int, str], Calls] = {}
    for r in request_rows:
        calls.setdefault((r["policy"], r["rate"], r.get("repeat", 0), r["job_id"]),
                         []).append(r)
    flows = [w for w in flow_rows if w.get("error") is None]
    stages = max((w["num_stages"] for w in flows), default=0)
    recorded = recorded_block_size(run_rows)
    if recorded and block_size and block_size != recorded:
        raise ValueError(f"--block-size {block_size}, but the replay recorded its engines' "
                         f"block size as {recorded}")
    chat_block = (recorded or block_size or DEFAULT_BLOCK_SIZE) if context == "chat" else None
    ms = metrics(stages, chat_block)
    runs: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    folds: dict[str, int] = {}
    for w in flows:
        runs.setdefault((w["policy"], w["rate"]), []).append(w)
        folds[w["job_id"]] = w.get("fold", 0)
    policies = list(dict.fromkeys(p for p, _ in runs))
    values, comparisons = [], []
    for rate in sorted({r for _, r in runs}):
        here = [p for p in policies if (p, rate) in runs]
        repeats = sorted({w.get("repeat", 0) for p in here for w in runs[p, rate]})
        jobs = sorted({w["job_id"] for p in here for w in runs[p, rate]})
        fold_of = iv.strata(folds, jobs)
        x: dict[tuple[str, str], np.ndarray] = {}
        for p in here:
            for m in ms:
                a = np.full((len(repeats), len(jobs)), np.nan)
                for w in runs[p, rate]:
                    rep = w.get("repeat", 0)
                    v = m.value(calls.get((p, rate, rep, w["job_id"]), []), w)
                    if v is not None:
                        a[repeats.index(rep), jobs.index(w["job_id"])] = v
                x[p, m.key] = a
            values.append({"policy": p, "rate": rate, **{
                m.key: _json(iv.interval(x[p, m.key], iv.mean, seed, fold_of)) for m in ms}})
        for p in here:
            if p == base or base not in here:
                continue
            row: dict[str, Any] = {"policy": p, "against": base, "rate": rate}
            for m in ms:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # 0 / 0 in every draw
                    c = iv.compare(x[p, m.key], x[base, m.key], iv.mean, m.difference, seed,
                                   fold_of)
                row[m.key] = None if c is None or not math.isfinite(c.value) else {
                    **_json(c), "verdict": iv.verdict(c, m.difference)}  # 0 / 0: none
            comparisons.append(row)
    counted: dict[tuple[str, float], dict[str, Any]] = {}
    for r in run_rows:
        c = (r.get("summary", {}).get("twin") or {}).get("retention")
        if c is None:
            continue
        total = counted.setdefault((r["policy"], r["rate"]), {
            "policy": r["policy"], "rate": r["rate"], "released": {}, "refused": 0,
            "admitted_first": 0})
        for reason, n in c["released"].items():
            total["released"][reason] = total["released"].get(reason, 0) + n
        total["refused"] += c["refused"]
        total["admitted_first"] += c["admitted_first"]
        total["released"] = dict(sorted(total["released"].items()))
    return {"folder": " + ".join(f.name for f in folders), "baseline": base,
            "tool_gap": meta.get("tool_gap", "none"), "context": context,
            "seeds": meta["seeds"],
            "block_size": chat_block, "stages": stages, "values": values,
            "comparisons": comparisons, "counters": list(counted.values())}


def _ci(v: Mapping[str, Any] | None, fmt: str) -> str:
    if not v:
        return "-"
    low, value, high = (fmt.format(x) if math.isfinite(x) else "inf"
                        for x in (v["low"], v["value"], v["high"]))
    text = f"{value} [{low}, {high}]"
    return f"**{text}**" if v.get("verdict") == "finding" else text


def tables(result: Mapping[str, Any]) -> str:
    """The values table and the comparisons table of one ``analyse`` result (markdown)."""
    ms = metrics(result["stages"], result["block_size"])
    head = f"| spec | rate/s | {' | '.join(m.name for m in ms)} |"
    out = [head, "|" + " --- |" * (len(ms) + 2)]
    for v in result["values"]:
        out.append(f"| {v['policy']} | {v['rate']:g} | "
                   + " | ".join(_ci(v[m.key], m.fmt) for m in ms) + " |")
    if result["comparisons"]:
        out += ["", f"Against {result['baseline']} (ratio; hit rates: difference in points; "
                "bold: finding; -: no value, e.g. 0 / 0):", "",
                head, "|" + " --- |" * (len(ms) + 2)]
        for c in result["comparisons"]:
            out.append(f"| {c['policy']} | {c['rate']:g} | " + " | ".join(
                _ci(c[m.key], "{:+.1f}" if m.difference else m.ratio_fmt) for m in ms) + " |")
    if result.get("counters"):
        over = "engines" if len(result.get("seeds", [])) < 2 else "engines and seeds"
        out += ["", f"What the engines did (twin counters, summed over {over}):", "",
                "| spec | rate/s | programs released, by reason | calls not protected "
                "| calls admitted first |", "| --- | --- | --- | --- | --- |"]
        for c in result["counters"]:
            released = ", ".join(f"{k} {v}" for k, v in c["released"].items()) or "none"
            out.append(f"| {c['policy']} | {c['rate']:g} | {released} | {c['refused']} "
                       f"| {c['admitted_first']} |")
    return "\n".join(out)


def plot(results: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Per replay folder (a column): recomputed prefix tokens per workflow (recomputed
    prompt tokens outside the chat context) and mean E2E per spec against the rate, with
    their 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 6.4),
                             squeeze=False)
    for col, res in enumerate(results):
        tokens = (("recomputed_prefix", "recomputed prefix tokens / wf") if res["block_size"]
                  else ("recomputed", "recomputed prompt tokens / wf"))
        for row, (key, label) in enumerate((tokens, ("e2e", "E2E mean (s)"))):
            ax = axes[row][col]
            for p in dict.fromkeys(v["policy"] for v in res["values"]):
                pts = [(v["rate"], v[key]) for v in res["values"]
                       if v["policy"] == p and v[key]]
                if not pts:
                    continue
                xs = [r for r, _ in pts]
                ys = [c["value"] for _, c in pts]
                err = [[c["value"] - c["low"] for _, c in pts],
                       [c["high"] - c["value"] for _, c in pts]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=p)
            ax.set_xlabel("workflows / s")
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title(f"tool gap {res['tool_gap']}", fontsize=10)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows = (len(labels) + 1) // 2
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.035 * rows, 1, 1))  # the legend below the plots
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _json(i: iv.Interval | None) -> dict[str, float] | None:
    return None if i is None else {"value": i.value, "low": i.low, "high": i.high}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels_bench.lab.twin.retention",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="*", help="replay folders (twin or live)")
    p.add_argument("--baseline", help="the spec compared against (default: the replay's "
                   "--baseline)")
    p.add_argument("--block-size", type=int, metavar="N",
                   help="the engines' KV block size, for the recomputed prefix, where the "
                   "replay did not record it (default: what it recorded, else "
                   f"{DEFAULT_BLOCK_SIZE}, vLLM's on GPUs)")
    p.add_argument("--plot", type=Path, metavar="PNG", help="write the plot here")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results here")
    p.add_argument("--pool", action="append", nargs="+", type=Path, metavar="DIR",
                   default=[], help="replay folders of one setup at several seeds, "
                   "analysed as one (the seeds resampled as repeats); repeat the option "
                   "for another group")
    a = p.parse_args(argv)
    if a.block_size is not None and not 1 <= a.block_size <= 1 << 20:
        p.error("--block-size must be in 1..1048576")
    if not a.folders and not a.pool:
        p.error("no replay folder given")
    try:
        results = [analyse(f, a.baseline, a.block_size)
                   for f in [*a.folders, *a.pool]]
    except (ValueError, KeyError) as e:
        raise SystemExit(f"error: {e}") from None
    for res in results:
        seeds = res.get("seeds") or []
        at = f", seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
        print(f"### {res['folder']}: tool gap {res['tool_gap']}, context {res['context']}"
              f"{at}\n\n{tables(res)}\n")
    if a.plot:
        plot(results, a.plot)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
