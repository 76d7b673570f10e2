"""The ``online`` policy learning from its own outcomes on the shipped traces as one
stream (issue 59, item 3, the model-choice half: modelled, no engines).

    python -m kernels_bench.lab.studies.online_stream [--seeds 20] [--delay 32]
        [--share 0.3] [--window 100] [--json FILE]

The shipped math and code traces' workflows (first stages: the call that chooses a
program's model), the two Qwen models (0.5B small, 1.5B big), in a random arrival order
per seed (``mixed``) or math first, then code (``drift``). Each workflow is routed by the
real ``online`` policy (``router.policies.online.Online``, built by the registry, deciding
on real router state: engine table, ledger, program table) and scores the trace's
verdict of the chosen model's run; its outcome is reported to the policy's book
(``OutcomeBook.report``, what ``POST /v1/hetserve/outcomes`` calls) only after ``--delay``
more workflows have arrived (delayed feedback: about that many in flight; no outcome of
a workflow not yet served is ever seen). Beside it, on the same streams:

- ``knn`` (offline, cross-fitted): the lexical KNN (``router.predictors.knn``, encoder
  ``lexical``, k 20, temperature 0.2, the docs' math setting) trained on the traces'
  other four fifths of problems (5 folds by problem hash), its predicted gain
  q[big] - q[small] held at the same share by Chimera's ``ShareMargin`` (Chimera with
  ``target_share`` on an idle cluster);
- the random-mix curve: at a big-model share s, the expected score
  (1 - s) x small + s x big of the same workflows (exact, no draw).

Gain over the curve: a window's mean score minus the curve at the window's own big
share (points). Intervals: 95% percentile over seeds (each seed: another arrival order
and other Thompson draws). What is modelled: no engines, no latency (the slack never
binds), the delay in arrivals; what is real: the policy, its book, its decisions.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from router.policies.chimera import ShareMargin
from router.policies.online import Online
from router.policies.registry import build_policy
from router.predictors.base import PredictorSet
from router.predictors.knn import KnnEstimator, KnnSettings
from router.predictors.records import held_out
from router.predictors.sources import trace_records
from router.predictors.table import PromptTable, prompt_table
from router.request import Workflow
from router.state.engines import EngineTable
from router.state.inflight import InflightLedger
from router.state.kv_hash import BlockHasher
from router.state.programs import ProgramTable
from router.state.view import StateView, engine_view
from router.types import ClusterInfo, RoutingRequest

SMALL, BIG = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
TRACES = {"math": ["data/traces/math-sampled.jsonl.gz"]
         + [f"data/traces/math-new{i}.jsonl.gz" for i in (3, 4, 5, 6, 7)],
         "code": ["data/traces/code.jsonl.gz"]}
"""The shipped math trace (100 problems, three workflows) with the confirmation slices
of problems 300-799 (``solve``), as ``make replay`` streams them, and the code trace."""
BOOT = 2000
FOLDS = 5
SPLIT_SEED, EVAL_FRACTION = 59, 0.6
"""The problems split once for tuning (``--split tune``) and evaluation (``--split eval``):
a problem is an evaluation problem when ``held_out(problem, SPLIT_SEED, EVAL_FRACTION)``
(every workflow of a problem on one side). The policy's settings are chosen on the tuning
stream; the numbers reported are the evaluation stream's."""


@dataclass
class Rows:
    table: PromptTable
    suite: list[str]
    knn_gain: np.ndarray
    """Cross-fitted predicted q[big] - q[small] per row."""


def load_rows() -> Rows:
    feats, problems, correct, suite = [], [], [], []
    for name, paths in TRACES.items():
        t = prompt_table([r for path in paths for r in trace_records(Path(path))],
                         [SMALL, BIG], first_stage_only=True)
        ok = ~np.isnan(t.correct).any(axis=1)
        feats += [f for f, k in zip(t.features, ok) if k]
        problems += [f"{name}:{p}" for p, k in zip(t.problems, ok) if k]
        correct.append(t.correct[ok])
        suite += [name] * int(ok.sum())
    c = np.concatenate(correct)
    table = PromptTable(feats, problems, [SMALL, BIG], c, np.ones_like(c), c)
    gain = np.full(len(feats), np.nan)
    settings = KnnSettings(encoder="lexical", k=20, temperature=0.2)
    for k in range(FOLDS):
        test = np.array([held_out(p, 0, 1 / FOLDS, k / FOLDS) for p in problems])
        train = PromptTable([f for f, t in zip(feats, test) if not t],
                            [p for p, t in zip(problems, test) if not t], [SMALL, BIG],
                            c[~test], np.ones_like(c[~test]), c[~test])
        knn = KnnEstimator.train(train, settings, progress=False)
        q, _ = knn.arrays([f for f, t in zip(feats, test) if t])
        gain[test] = q[:, 1] - q[:, 0]
    assert not np.isnan(gain).any()
    return Rows(table, suite, gain)


class Cluster:
    """Two idle engines, one per model, as the router's state holds them."""

    def __init__(self) -> None:
        from types import SimpleNamespace
        engines = {"small": SMALL, "big": BIG}
        inst = [SimpleNamespace(name=n, served_model_name=m, url=f"http://{n}",
                                max_model_len=None) for n, m in engines.items()]
        self.table = EngineTable(inst, heartbeat_timeout_s=1e9)
        self.ledger, self.programs = InflightLedger(), ProgramTable(ttl_s=300)
        self.view = StateView(self.table, self.ledger, self.programs, BlockHasher())
        self.info = ClusterInfo(engines)

    def cands(self) -> list[Any]:
        return [engine_view(e, self.ledger, 0.0) for _, e in sorted(self.table.engines.items())]


def run_online(rows: Rows, order: Sequence[int], seed: int, share: float, delay: int,
               extra: dict[str, Any] | None = None
               ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Per arrival: big chosen, score; and the policy's book counts."""
    cl = Cluster()
    policy = build_policy("online", {"online": {
        "target_share": share, "seed": seed,
        "decode_ms_per_token": {SMALL: 1.0, BIG: 3.0}, **(extra or {})}}, cl.info,
        PredictorSet())
    assert isinstance(policy, Online)
    big, score, pending = [], [], []
    for n, i in enumerate(order):
        f = rows.table.features[i]
        pid = f"w{n}"
        req = RoutingRequest(pid, None, prompt_text=f.prompt_text, system_text=f.system_text,
                             user_text=f.user_text, num_prompt_tokens=f.prompt_tokens,
                             workflow=Workflow(program_id=pid, workflow=f.workflow,
                                               stage=f.stage, stage_index=0))
        model = policy.decide(req, cl.cands(), cl.view, None).model
        j = 1 if model == BIG else 0
        big.append(j)
        score.append(rows.table.correct[i, j])
        pending.append((pid, score[-1]))
        if len(pending) > delay:  # the workflow that arrived ``delay`` before ends now
            done, s = pending.pop(0)
            assert policy.book.report(done, None, s) == "accepted"
    return np.array(big), np.array(score), list(policy.book.counts.values())


def run_knn(rows: Rows, order: Sequence[int], share: float) -> tuple[np.ndarray, np.ndarray]:
    margin = ShareMargin(share, 200, 1.0)
    big = np.array([rows.knn_gain[i] >= margin.next(float(rows.knn_gain[i])) for i in order],
                   dtype=int)
    score = rows.table.correct[np.asarray(order), big]
    return big, score


def windows(rows: Rows, order: Sequence[int], big: np.ndarray, score: np.ndarray,
            width: int) -> list[tuple[float, float]]:
    """Per window of ``width`` arrivals: (gain over the mix curve, points; big share)."""
    c = rows.table.correct[np.asarray(order)]
    out = []
    for a in range(0, len(order), width):
        s = big[a:a + width].mean()
        curve = ((1 - s) * c[a:a + width, 0] + s * c[a:a + width, 1]).mean()
        out.append((100 * (score[a:a + width].mean() - curve), float(s)))
    return out


def summary(per_seed: list[list[tuple[float, float]]]) -> list[dict[str, float]]:
    """Per window: the mean gain over seeds, its 95% bootstrap interval (seeds drawn with
    replacement), the seeds' own 2.5-97.5% spread, and the mean big share."""
    g = np.array([[w[0] for w in s] for s in per_seed])
    sh = np.array([[w[1] for w in s] for s in per_seed])
    draws = np.random.default_rng(0).integers(0, len(g), (BOOT, len(g)))
    lo, hi = np.percentile(g[draws].mean(1), [2.5, 97.5], axis=0)
    s_lo, s_hi = np.percentile(g, [2.5, 97.5], axis=0)
    return [{"gain": float(m), "lo": float(a), "hi": float(b), "spread_lo": float(c),
             "spread_hi": float(d), "share": float(s)}
            for m, a, b, c, d, s in zip(g.mean(0), lo, hi, s_lo, s_hi, sh.mean(0))]


def paired(a: list[list[tuple[float, float]]], b: list[list[tuple[float, float]]]
           ) -> dict[str, float]:
    """Mean of a - b over seeds (one window each) with its 95% bootstrap interval; the
    ratio of the means a / b and a - 0.8 b (issue 59's target: a >= 0.8 b), each with
    its 95% interval from the same draws of seeds."""
    x = np.array([s[0][0] for s in a])
    y = np.array([s[0][0] for s in b])
    d = x - y
    draws = np.random.default_rng(1).integers(0, len(d), (BOOT, len(d)))
    lo, hi = np.percentile(d[draws].mean(1), [2.5, 97.5])
    r_lo, r_hi = np.percentile(x[draws].mean(1) / y[draws].mean(1), [2.5, 97.5])
    t_lo, t_hi = np.percentile((x - 0.8 * y)[draws].mean(1), [2.5, 97.5])
    return {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi),
            "ratio": float(x.mean() / y.mean()), "ratio_lo": float(r_lo),
            "ratio_hi": float(r_hi), "minus_0.8": float((x - 0.8 * y).mean()),
            "minus_0.8_lo": float(t_lo), "minus_0.8_hi": float(t_hi)}


BEFORE = {"explore": 1.0, "temperature": 0.1, "prior_weight": 2.0, "reindex_every": 32,
          "share_window": 200, "share_correction": 0.0}
"""The ``online`` settings before the tuning of docs/research/online.md ("Tuning"): plain
Thompson sampling, Chimera's quantile alone (``--set`` each to rerun them)."""


def decision_time(rows: Rows, configs: dict[str, dict[str, Any]], examples: int = 2000
                  ) -> dict[str, dict[str, float]]:
    """``Online.decide`` alone (perf_counter around it) for each of ``configs`` (online
    settings), the calls interleaved (one call each in turn, so the machine's load falls
    on all alike), each book filled to ``examples`` credited calls first (the router
    bench's book stays empty: no outcomes reach it); microseconds, over the 600 calls
    after the fill."""
    import time

    runs = {}
    for name, extra in configs.items():
        cl = Cluster()
        policy = build_policy("online", {"online": {
            "max_examples": examples, "decode_ms_per_token": {SMALL: 1.0, BIG: 3.0},
            **extra}}, cl.info, PredictorSet())
        assert isinstance(policy, Online)
        runs[name] = (cl, policy, random.Random(0), [])
    n = len(rows.suite)
    for k in range(examples + 600):
        f = rows.table.features[k % n]
        pid = f"d{k}"
        req = RoutingRequest(pid, None, prompt_text=f.prompt_text, system_text=f.system_text,
                             user_text=f.user_text, num_prompt_tokens=f.prompt_tokens,
                             workflow=Workflow(program_id=pid, workflow=f.workflow,
                                               stage=f.stage, stage_index=0))
        for cl, policy, rng, spent in runs.values():
            cands = cl.cands()
            t = time.perf_counter()
            policy.decide(req, cands, cl.view, None)
            spent.append(time.perf_counter() - t)
            policy.book.report(pid, None, float(rng.random() < 0.5))
    out = {}
    for name, (_, policy, _, spent) in runs.items():
        us = 1e6 * np.array(spent[examples:])
        out[name] = {"p50_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
                     "examples": len(policy.book.examples)}
    return out


def twin_curves(rows: Rows, runs: Sequence[Path], width: int, big: str = "tiny-b"
                ) -> dict[str, list[dict[str, float]]]:
    """Learning curves of twin runs (``python -m kernels_bench twin`` output folders, one
    per seed, first attempts): per policy and window of ``width`` workflows in arrival
    order, the gain over the random-mix curve at the window's big share, per workflow
    correct(chosen) - ((1 - s) x small + s x big) from the traces' verdicts, pooled over
    the runs, with a 95% bootstrap interval over those workflows."""
    verdict = {}
    for f, prob, c in zip(rows.table.features, rows.table.problems, rows.table.correct):
        verdict[(prob.split(":", 1)[1], f.workflow)] = c
    by: dict[str, dict[int, list[float]]] = {}
    share: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        wfs: dict[str, list[dict[str, Any]]] = {}
        for line in (run / "workflows.jsonl").read_text().splitlines():
            w = json.loads(line)
            if w["error"] is None:
                wfs.setdefault(w["policy"], []).append(w)
        for policy, ws in wfs.items():
            ws.sort(key=lambda w: w["arrival_s"])
            for a in range(0, len(ws), width):
                chunk = ws[a:a + width]
                went = np.array([w["final_models"][0] == big for w in chunk], float)
                s = went.mean()
                c = np.array([verdict[(w["problem_id"], w["workflow"])] for w in chunk])
                got = c[np.arange(len(chunk)), went.astype(int)]
                gain = 100 * (got - ((1 - s) * c[:, 0] + s * c[:, 1]))
                by.setdefault(policy, {}).setdefault(a // width, []).extend(gain.tolist())
                share.setdefault(policy, {}).setdefault(a // width, []).append(s)
    out = {}
    rng = np.random.default_rng(0)
    for policy, win in by.items():
        out[policy] = []
        for k in sorted(win):
            g = np.array(win[k])
            boot = g[rng.integers(0, len(g), (BOOT, len(g)))].mean(1)
            lo, hi = np.percentile(boot, [2.5, 97.5])
            out[policy].append({"gain": float(g.mean()), "lo": float(lo), "hi": float(hi),
                                "share": float(np.mean(share[policy][k])), "n": len(g)})
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--delay", type=int, default=32)
    p.add_argument("--share", type=float, default=0.3)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--neighbours", type=int, default=20,
                   help="the online policy's neighbours setting (0: only its context arms "
                   "run, as arms_only always is)")
    p.add_argument("--after", type=int, default=500,
                   help="the last row: every workflow after this many as one window")
    p.add_argument("--split", choices=("all", "tune", "eval"), default="all",
                   help="the workflows of every problem, of the tuning problems only, or of "
                   "the held-out evaluation problems only (SPLIT_SEED, EVAL_FRACTION)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                   help="an online setting for the `online` runs (repeatable), e.g. "
                   "--set temperature=0.2")
    p.add_argument("--streams", nargs="+", choices=("mixed", "drift"),
                   default=["mixed", "drift"])
    p.add_argument("--no-arms-only", action="store_true",
                   help="skip the arms_only runs (neighbours 0)")
    p.add_argument("--json", type=Path)
    p.add_argument("--decision-time", action="store_true",
                   help="only time decide() with neighbours 0, --neighbours and the "
                   "settings before the tuning (BEFORE), interleaved, each book filled with "
                   "2000 examples")
    p.add_argument("--twin", type=Path, nargs="+",
                   help="only the learning curves of these twin runs (one folder per seed)")
    a = p.parse_args(argv)
    rows = load_rows()
    if a.twin:
        curves = twin_curves(rows, a.twin, a.window)
        for policy, ws in curves.items():
            print(f"| {policy} | " + " | ".join(
                f"{w['gain']:+.1f} [{w['lo']:+.1f}, {w['hi']:+.1f}] ({w['share']:.2f})"
                for w in ws) + " |")
        if a.json:
            a.json.write_text(json.dumps(curves, indent=1))
        return
    if a.decision_time:
        got = decision_time(rows, {"neighbours 0": {"neighbours": 0},
                                   f"neighbours {a.neighbours}": {"neighbours": a.neighbours},
                                   "before": {"neighbours": a.neighbours, **BEFORE}})
        for k, v in got.items():
            print(f"{k}: decide() p50 {v['p50_us']:.0f} us, p99 {v['p99_us']:.0f} "
                  f"us ({v['examples']} examples)")
        if a.json:
            a.json.write_text(json.dumps(got, indent=1))
        return
    extra = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.set)}
    keep = [i for i, p in enumerate(rows.table.problems)
            if a.split == "all" or held_out(p, SPLIT_SEED, EVAL_FRACTION) == (a.split == "eval")]
    n = len(keep)
    math_rows = [i for i in keep if rows.suite[i] == "math"]
    code_rows = [i for i in keep if rows.suite[i] == "code"]
    result: dict[str, Any] = {"rows": n, "delay": a.delay, "share": a.share,
                              "window": a.window, "seeds": a.seeds, "split": a.split,
                              "split_seed": SPLIT_SEED, "eval_fraction": EVAL_FRACTION,
                              "settings": extra, "switch": len(math_rows)}
    for stream in a.streams:
        names = (["online"] if a.neighbours else []) + ([] if a.no_arms_only else
                                                        ["arms_only"]) + ["knn"]
        per: dict[str, list[Any]] = {k: [] for n in names for k in (
            n, n + "_after", n + "_pre", n + "_post", n + "_new", n + "_seen")}
        counts = []
        for seed in range(a.seeds):
            rng = random.Random(seed)
            if stream == "mixed":
                order = keep[:]
                rng.shuffle(order)
            else:
                m, c = math_rows[:], code_rows[:]
                rng.shuffle(m)
                rng.shuffle(c)
                order = m + c
            got = {}
            if a.neighbours:
                got["online"] = run_online(rows, order, seed, a.share, a.delay,
                                           {"neighbours": a.neighbours, **extra})
            if not a.no_arms_only:
                got["arms_only"] = run_online(rows, order, seed, a.share, a.delay,
                                              {"neighbours": 0})
            got["knn"] = (*run_knn(rows, order, a.share), [])
            counts.append(got[names[0]][2])
            half = a.after  # everything after this many workflows as one window
            seen: set[str] = set()
            new = []  # a workflow of a problem not yet in the stream (another workflow of
            for i in order:  # a problem seen before is one the online learner has met)
                new.append(rows.table.problems[i] not in seen)
                seen.add(rows.table.problems[i])
            fresh = np.array(new[half:])
            for name, (b, sc, _) in got.items():
                per[name].append(windows(rows, order, b, sc, a.window))
                per[name + "_after"].append(windows(rows, order[half:], b[half:], sc[half:], n))
                for key, m in (("_new", fresh), ("_seen", ~fresh)):
                    per[name + key].append(windows(
                        rows, [i for i, k in zip(order[half:], m) if k], b[half:][m],
                        sc[half:][m], n))
                if stream == "drift":  # the switch's own windows: the 300 before, then on
                    sw, lo = len(math_rows), max(0, len(math_rows) - 300)
                    per[name + "_pre"].append(windows(rows, order[lo:sw], b[lo:sw], sc[lo:sw],
                                                      sw - lo))
                    per[name + "_post"].append(windows(rows, order[sw:], b[sw:], sc[sw:],
                                                       a.window))
        result[stream] = {k: summary(v) for k, v in per.items() if v}
        result[stream]["paired_after"] = {
            f"{x} - knn": paired(per[x + "_after"], per["knn_after"])
            for x in names if x != "knn"}
        for key in ("new", "seen"):
            result[stream][f"paired_after_{key}"] = {
                f"{x} - knn": paired(per[f"{x}_{key}"], per[f"knn_{key}"])
                for x in names if x != "knn"}
        result[stream]["book_counts"] = np.array(counts).sum(0).tolist()
        print(f"\n{stream}: gain over the random-mix curve (points), windows of {a.window}, "
              f"95% over {a.seeds} seeds; big share")
        print("| workflows | " + " | ".join(f"{x} | share" for x in names) + " |")
        print("|---" * (2 * len(names) + 1) + "|")
        res = result[stream]
        spans = [f"{k * a.window}-{min(n, (k + 1) * a.window)}"
                 for k in range(len(res["knn"]))] + [f"after {a.after}"]
        for k, span in enumerate(spans):
            cells = [res[x][k] if k < len(res[x]) else res[x + "_after"][0] for x in names]
            print(f"| {span} | " + " | ".join(
                f"{c['gain']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}] | {c['share']:.2f}"
                for c in cells) + " |")
        for k, v in res["paired_after"].items():
            print(f"after {a.after}, {k}: {v['diff']:+.1f} [{v['lo']:+.1f}, {v['hi']:+.1f}] "
                  f"points (paired over seeds); ratio {v['ratio']:.2f} [{v['ratio_lo']:.2f}, "
                  f"{v['ratio_hi']:.2f}]; minus 0.8 x knn {v['minus_0.8']:+.1f} "
                  f"[{v['minus_0.8_lo']:+.1f}, {v['minus_0.8_hi']:+.1f}]")
        for key, what in (("new", "a problem's first workflow in the stream"),
                          ("seen", "a problem met before in another workflow")):
            print(f"after {a.after}, {what}: " + "; ".join(
                f"{x} {res[f'{x}_{key}'][0]['gain']:+.1f} [{res[f'{x}_{key}'][0]['lo']:+.1f}, "
                f"{res[f'{x}_{key}'][0]['hi']:+.1f}]" for x in names))
            for k, v in res[f"paired_after_{key}"].items():
                print(f"  {k}: {v['diff']:+.1f} [{v['lo']:+.1f}, {v['hi']:+.1f}]; ratio "
                      f"{v['ratio']:.2f} [{v['ratio_lo']:.2f}, {v['ratio_hi']:.2f}]")
        if stream == "drift":
            sw = len(math_rows)
            print(f"around the switch (workflow {sw}): the 300 before, then windows of "
                  f"{a.window} after it")
            for x in names:
                pre, post = res[x + "_pre"][0], res[x + "_post"]
                print(f"| {x} | {pre['gain']:+.1f} [{pre['lo']:+.1f}, {pre['hi']:+.1f}] | " +
                      " | ".join(f"{c['gain']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}] "
                                 f"({c['share']:.2f})" for c in post) + " |")
        print("book counts (accepted, duplicate, unknown, late, retry_failure), all seeds:",
              res["book_counts"])
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
