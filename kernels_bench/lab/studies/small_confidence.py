"""The small model's confidence in its own output, from its token log-probabilities
(issue 30 item 4: a signal the workflow produces, read after the small model's run).

    python -m kernels_bench.lab.studies.small_confidence [--trace data/traces/math.jsonl.gz ...]
        [--cluster data/traces/qwen-cpu.toml] [--engine qwen2.5-coder-0.5b-instruct]
        [--out docs/research/predictors/quality/confidence.json] [--report]

Starts one engine of the cluster file (``kernels_bench.lab.trace.engines.engine_session``: the
launcher's command, placement and environment). For every (problem, workflow) of the
traces with a greedy run of the engine's model it sends the run's final stage (the answer:
the solver's or the coder's) back to the engine: the stage's messages with the engine's
chat template (``/tokenize``, ``add_generation_prompt``), then the output text the trace
recorded (``/tokenize``, no special tokens), as one ``/v1/completions`` prompt with
``prompt_logprobs`` 0 and one output token. Each output token's log-probability given
everything before it is what the live call would have returned with ``logprobs`` (the
run was greedy: every token was the model's top choice), up to re-tokenization of the
recorded text and batch numerics. Per problem also the problem text alone (the user
prompt, no template): its mean token log-probability, a difficulty proxy read before any
run. A request that fails (an HTTP error, a dropped connection, an answer not of the
expected shape) fails its row alone: the others are kept and saved, and the script ends
with the count of failed rows and the first error; running it again retries only those.

Stored per row (``rows["<problem>|<workflow>"]``, ``token_stats``): the number of output
tokens, their mean log-probability, minimum, 5/10/25/50% quantiles and the mean over the
last 8 tokens (where a final answer is written). A row whose prompt and output exceed the
engine's ``max_model_len`` is stored as skipped. Resumable: the file is rewritten every
``SAVE_EVERY`` rows and a rerun skips the rows it holds. About 100 prompt tokens/s on 2
CPU cores for the 0.5B (the math trace's 300 rows: about 40 minutes). ``--report`` prints
what the file holds and starts nothing. ``python -m kernels_bench.lab.studies.quality_study
--confidence FILE`` judges the rows as an escalation signal.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np
from tqdm import tqdm

from router.trace_format import WorkflowRun, load_trace

TRACES = ["data/traces/math.jsonl.gz", "data/traces/code.jsonl.gz"]
TAIL = 8
"""Tokens at the end of the output averaged as ``tail``: a final answer's line."""
SAVE_EVERY = 10
QUANTILES = (5, 10, 25, 50)


def token_stats(logprobs: list[float]) -> dict[str, float | int]:
    """Summary of one output's token log-probabilities (the signal's only formula)."""
    lp = np.asarray(logprobs, dtype=float)
    out: dict[str, float | int] = {"tokens": int(lp.size), "mean": float(lp.mean()),
                                   "min": float(lp.min()), "tail": float(lp[-TAIL:].mean())}
    out.update({f"p{q}": float(np.percentile(lp, q)) for q in QUANTILES})
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in out.items()}


def prompt_logprobs(client: httpx.Client, url: str, model: str, ids: list[int]) -> list[float]:
    """Log-probability of each token of ``ids`` after the first, given those before it."""
    r = client.post(f"{url}/v1/completions", json={
        "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
        "prompt_logprobs": 0})
    r.raise_for_status()
    entries = r.json()["choices"][0]["prompt_logprobs"]
    return [entry[str(tok)]["logprob"] for tok, entry in zip(ids[1:], entries[1:])]


def tokenize(client: httpx.Client, url: str, model: str, **body: Any) -> list[int]:
    r = client.post(f"{url}/tokenize", json={"model": model, **body})
    r.raise_for_status()
    return r.json()["tokens"]


def output_logprobs(client: httpx.Client, url: str, model: str, messages: list[dict[str, str]],
                    output: str, max_len: int) -> list[float] | str:
    """Each token's log-probability of ``output`` as the answer to chat ``messages``
    (the engine's chat template), or why it cannot be scored."""
    head = tokenize(client, url, model, messages=messages, add_generation_prompt=True)
    tail = tokenize(client, url, model, prompt=output, add_special_tokens=False)
    if not tail:
        return "empty output"
    if len(head) + len(tail) + 1 > max_len:
        return f"{len(head) + len(tail)} tokens > max_model_len {max_len}"
    return prompt_logprobs(client, url, model, head + tail)[len(head) - 1:]


def score_row(client: httpx.Client, url: str, model: str, run: WorkflowRun,
              max_len: int) -> dict[str, Any]:
    stage = run.models[model].stages[-1]
    lps = output_logprobs(client, url, model,
                          [{"role": m.role, "content": m.content} for m in stage.messages],
                          stage.output_text, max_len)
    if isinstance(lps, str):
        return {"skipped": lps}
    return {"role": stage.role, "finish_reason": stage.finish_reason, **token_stats(lps)}


def attempt(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | Exception:
    """``call()``, or the error of its request: one failed row does not lose the rest."""
    try:
        return call()
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
        return e


def score_problem(client: httpx.Client, url: str, model: str, text: str) -> dict[str, Any]:
    ids = tokenize(client, url, model, prompt=text, add_special_tokens=False)
    return token_stats(prompt_logprobs(client, url, model, ids)) if len(ids) > 1 else {
        "skipped": "fewer than 2 tokens"}


def report(res: dict[str, Any]) -> str:
    rows = [r for r in res["rows"].values() if "skipped" not in r]
    lines = [f"{res['model']}: {len(res['rows'])} rows ({len(rows)} scored), "
             f"{len(res['problems'])} problems"]
    if rows:
        for k in ("tokens", "mean", "min", "p10", "tail"):
            v = np.array([r[k] for r in rows], dtype=float)
            lines.append(f"  {k:6s} median {np.median(v):9.3f}  "
                         f"[{np.percentile(v, 5):.3f}, {np.percentile(v, 95):.3f}] (5-95%)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", nargs="+", default=TRACES,
                   help="trace files (default: the shipped math and code traces)")
    p.add_argument("--cluster", type=Path, default=Path("data/traces/qwen-cpu.toml"),
                   help="cluster file that names the engine (default %(default)s)")
    p.add_argument("--engine", default="qwen2.5-coder-0.5b-instruct",
                   help="the engine to start, whose model's runs are scored "
                        "(default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("docs/research/predictors/quality/confidence.json"),
                   help="results, resumed when present (default %(default)s)")
    p.add_argument("--report", action="store_true", help="print the file's summary and stop")
    a = p.parse_args()

    from kernels_bench.lab.trace.engines import engine_session, single_engine_config

    cfg = single_engine_config(a.cluster, a.engine)
    model = cfg.engine(a.engine).served_model_name
    res: dict[str, Any] = {"engine": a.engine, "model": model, "tail_tokens": TAIL,
                           "rows": {}, "problems": {}}
    if a.out.exists():
        try:
            res = json.loads(a.out.read_text())
        except ValueError as e:
            raise SystemExit(f"{a.out}: not JSON ({e}); use another --out") from None
        if not isinstance(res, dict) or not {"rows", "problems"} <= set(res):
            raise SystemExit(f"{a.out}: not a file of this script; use another --out")
        if res.get("model") != model or res.get("tail_tokens") != TAIL:
            raise SystemExit(f"{a.out} holds {res.get('model')!r} (tail {res.get('tail_tokens')})"
                             f"; use another --out")
    if a.report:
        print(report(res))
        return
    runs = [r for path in a.trace for r in load_trace(path).runs if model in r.models]
    if not runs:
        raise SystemExit(f"no greedy run of {model!r} in {' '.join(a.trace)}")
    todo = [r for r in runs if f"{r.problem_id}|{r.workflow}" not in res["rows"]]
    texts = {r.problem_id: r.user_prompt for r in runs
             if r.problem_id not in res["problems"]}
    if not todo and not texts:
        print(report(res))
        return
    a.out.parent.mkdir(parents=True, exist_ok=True)
    max_len = cfg.engine(a.engine).max_model_len or 4096

    def save() -> None:
        tmp = a.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=0, sort_keys=True) + "\n")
        tmp.replace(a.out)

    t0 = time.monotonic()
    with engine_session(cfg, a.engine) as eng, httpx.Client(timeout=600) as client, \
            ThreadPoolExecutor(2) as pool:
        res.setdefault("engine_started_after_s", round(time.monotonic() - t0, 1))
        problems = list(texts.items())
        failed: list[str] = []
        for (pid, _), out in zip(problems, tqdm(pool.map(
                lambda pt: attempt(lambda: score_problem(client, eng.base_url, model, pt[1])),
                problems), total=len(problems), desc="problem texts", unit="problem")):
            if isinstance(out, Exception):
                failed.append(f"problem {pid}: {type(out).__name__}: {out}")
            else:
                res["problems"][pid] = out
        save()
        bar = tqdm(pool.map(lambda r: attempt(
            lambda: score_row(client, eng.base_url, model, r, max_len)), todo),
            total=len(todo), desc="final stages", unit="row")
        for n, (run, out) in enumerate(zip(todo, bar), 1):
            if isinstance(out, Exception):
                failed.append(f"{run.problem_id}|{run.workflow}: {type(out).__name__}: {out}")
            else:
                res["rows"][f"{run.problem_id}|{run.workflow}"] = out
            if n % SAVE_EVERY == 0:
                save()
        save()
    if failed:
        raise SystemExit(f"{len(failed)} of {len(problems) + len(todo)} requests failed "
                         f"(first: {failed[0]}); the others are saved in {a.out}: run the "
                         "same command again to retry the failed ones")
    print(report(res))


if __name__ == "__main__":
    main()
