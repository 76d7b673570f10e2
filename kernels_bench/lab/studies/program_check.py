"""A check math states none of: the small model's own program for the problem (issue 30
item 4, a signal the workflow can produce; program-aided answering, as in PAL).

    python -m kernels_bench.lab.studies.program_check [--trace data/traces/math.jsonl.gz]
        [--cluster data/traces/qwen-cpu.toml] [--engine qwen2.5-coder-0.5b-instruct]
        [--out docs/research/predictors/quality/programs.json] [--report]

Starts one engine of the cluster file (``kernels_bench.lab.trace.engines.engine_session``, as
the trace builder does) and asks it once per math problem of the traces, greedily, for a
Python program that computes the answer (``SYSTEM``: a ``solution()`` returning a number;
the trace's ``max_tokens``). An agent that solves the problem in words can run that
program in the sandbox and compare (``kernels_bench.lab.trace.suites.program_agrees``): where
the two agree, keep the small model's answer; where they do not, escalate. The program
costs one more call of the small model per problem, made beside the workflow.

Stored per problem: the output text, finish reason and token counts. ``--report`` runs the
programs in the sandbox (never here) and prints how often the program is right (against
the reference) and how often it agrees with each model's greedy final answer per
workflow, and with whether that answer is right; ``python -m
kernels_bench.lab.studies.quality_study --programs FILE`` judges the agreement as an
escalation signal. Resumable: saved every ``SAVE_EVERY`` problems, a rerun asks only for
the problems the file lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from kernels_bench.lab.trace.suites import PROGRAM_ENTRY_POINT, program_agrees
from router.trace_format import WorkflowRun, load_trace

SYSTEM = ("You write Python programs that solve math word problems. Reply with a single "
          f"```python code block that defines a function `{PROGRAM_ENTRY_POINT}()` with no "
          "arguments, which computes the answer step by step and returns it as a number. "
          "No input, no printing, no tests.")
"""The program's system prompt (fixed before any program was judged)."""
USER = "Problem: {problem}"
SAVE_EVERY = 10
CONCURRENCY = 16


def ask(client: httpx.Client, url: str, model: str, problem: str, max_tokens: int
        ) -> dict[str, Any]:
    """One greedy program for ``problem``."""
    t0 = time.monotonic()
    r = client.post(f"{url}/v1/chat/completions", json={
        "model": model, "temperature": 0.0, "seed": 0, "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": USER.format(problem=problem)}]})
    r.raise_for_status()
    out = r.json()
    choice = out["choices"][0]
    return {"output_text": choice["message"]["content"] or "",
            "finish_reason": choice.get("finish_reason") or "",
            "prompt_tokens": out["usage"]["prompt_tokens"],
            "output_tokens": out["usage"]["completion_tokens"],
            "latency_s": round(time.monotonic() - t0, 2)}


def checks(programs: dict[str, Any], runs: list[WorkflowRun], models: list[str]
           ) -> dict[str, Any]:
    """Per problem whether its program is right, per (problem, workflow) and model of
    ``models`` whether it agrees with that model's greedy final answer (sandbox runs)."""
    have = [r for r in runs if r.problem_id in programs]
    problems = {r.problem_id: r.reference for r in have}
    jobs = [(p, None, None, ref) for p, ref in problems.items()] + [
        (r.problem_id, r.workflow, m, r.models[m].final_answer) for r in have for m in models]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        verdicts = list(tqdm(pool.map(
            lambda j: program_agrees(programs[j[0]]["output_text"], j[3]), jobs),
            total=len(jobs), desc="programs in the sandbox", unit="run"))
    right = {p: v for (p, w, _, _), v in zip(jobs, verdicts) if w is None}
    agree: dict[str, dict[str, bool | None]] = {}
    for (p, w, m, _), v in zip(jobs, verdicts):
        if w is not None:
            agree.setdefault(f"{p}|{w}", {})[m] = v
    return {"right": right, "agrees": agree}


def report(res: dict[str, Any], runs: list[WorkflowRun]) -> str:
    programs = res["problems"]
    models = sorted(set.intersection(*(set(r.models) for r in runs)))
    c = checks(programs, runs, models)
    right = list(c["right"].values())
    lines = [f"{res['model']}: {len(programs)} programs; right {sum(map(bool, right))} "
             f"({sum(map(bool, right)) / max(1, len(right)):.3f}); cut at max_tokens "
             f"{sum(p['finish_reason'] == 'length' for p in programs.values())}"]
    by_key = {f"{r.problem_id}|{r.workflow}": r for r in runs}
    for m in models:
        rows = [(by_key[k].models[m].correct, a[m]) for k, a in c["agrees"].items()]
        agree = [ok for ok, v in rows if v]
        differ = [ok for ok, v in rows if not v]
        lines.append(f"  {m}: {len(rows)} rows; its answer agrees with the program in "
                     f"{len(agree)} (right {sum(agree) / max(1, len(agree)):.3f}), "
                     f"not in {len(differ)} (right {sum(differ) / max(1, len(differ)):.3f})")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", nargs="+", default=["data/traces/math.jsonl.gz"],
                   help="math trace files (default: the shipped math trace)")
    p.add_argument("--cluster", type=Path, default=Path("data/traces/qwen-cpu.toml"),
                   help="cluster file that names the engine (default %(default)s)")
    p.add_argument("--engine", default="qwen2.5-coder-0.5b-instruct",
                   help="the engine to start, which writes the programs (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("docs/research/predictors/quality/programs.json"),
                   help="results, resumed when present (default %(default)s)")
    p.add_argument("--report", action="store_true",
                   help="judge the file's programs against the traces and stop")
    a = p.parse_args()

    from kernels_bench.lab.trace.engines import engine_session, single_engine_config

    cfg = single_engine_config(a.cluster, a.engine)
    model = cfg.engine(a.engine).served_model_name
    traces = [load_trace(path) for path in a.trace]
    if any(t.header.suite != "math" for t in traces):
        raise SystemExit("--trace: math traces only (code states its own check, the "
                         "prompt's examples)")
    max_tokens = int(traces[0].header.settings["max_tokens"])
    runs = [r for t in traces for r in t.runs]
    if not runs:
        raise SystemExit(f"no workflow runs in {' '.join(a.trace)}")
    res: dict[str, Any] = {"engine": a.engine, "model": model, "system": SYSTEM, "user": USER,
                           "max_tokens": max_tokens, "problems": {}}
    if a.out.exists():
        try:
            old = json.loads(a.out.read_text())
        except ValueError as e:
            raise SystemExit(f"{a.out}: not JSON ({e}); use another --out") from None
        if not isinstance(old, dict) or not isinstance(old.get("problems"), dict) or not all(
                isinstance(v, dict) and isinstance(v.get("output_text"), str)
                and isinstance(v.get("finish_reason"), str) for v in old["problems"].values()):
            raise SystemExit(f"{a.out}: not a file of this script; use another --out")
        same = {k: res[k] for k in ("model", "system", "user", "max_tokens")}
        if {k: old.get(k) for k in same} != same:
            raise SystemExit(f"{a.out} holds programs of another model, prompt or max_tokens "
                             f"({old.get('model')!r}); use another --out")
        res = old
    if a.report:
        print(report(res, runs))
        return
    texts = {r.problem_id: r.user_prompt for r in runs if r.problem_id not in res["problems"]}
    if texts:
        a.out.parent.mkdir(parents=True, exist_ok=True)

        def save() -> None:
            tmp = a.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(res, indent=0, sort_keys=True) + "\n")
            tmp.replace(a.out)

        with engine_session(cfg, a.engine) as eng, httpx.Client(timeout=900) as client, \
                ThreadPoolExecutor(CONCURRENCY) as pool:
            todo = list(texts.items())
            bar = tqdm(pool.map(lambda pt: ask(client, eng.base_url, model, pt[1], max_tokens),
                                todo), total=len(todo), desc="programs", unit="problem")
            for n, ((pid, _), out) in enumerate(zip(todo, bar), 1):
                res["problems"][pid] = out
                if n % SAVE_EVERY == 0:
                    save()
            save()
    print(report(res, runs))


if __name__ == "__main__":
    main()
