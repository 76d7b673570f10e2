"""``python -m kernels_bench trace build``: run every model of a cluster over a suite's
workflows and append one trace unit per finished (problem, workflow, model).

Models run one after another, each on its own engine (started through the launcher, then
stopped). Inside a model, up to ``--concurrency`` workflow runs are in flight, each
sending its stages in order: the greedy run of every (problem, workflow) (temperature 0,
fixed seed) and, with ``--samples K``, K sampled runs of it (``--temperature``,
``--top-p``, a seed of its own per run: ``sample_seed``). A finished unit is appended to
``--out`` at once (flushed, fsynced); a restarted build reads the file, skips every unit
already there and does the rest, so a killed build loses only the units in flight, and a
larger K runs only the new samples. The header records the settings (the sampling ones
under ``sampling``, added when a file first gets samples); resuming with different
settings is refused.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
from tqdm import tqdm

from kernels_bench.lab.trace.suites import SOURCES, Problem, judge, load_problems
from kernels_bench.lab.trace.workflows import WORKFLOWS, prompt_version, stage_messages
from router.trace_format import (
    FORMAT,
    VERSION,
    Header,
    Stage,
    TraceWriter,
    Unit,
    read_records,
    sample_seed,
    stage_seed,
    unit_key,
    write_records,
)

SAMPLING = "sampling"
"""The header settings key of the sampled runs' settings."""


@dataclass(frozen=True)
class Settings:
    suite: str
    problems: int
    seed: int
    max_tokens: int
    concurrency: int
    code_timeout_s: float
    samples: int = 0
    """Sampled runs per (problem, workflow, model), beside the greedy run."""
    temperature: float = 0.7
    """The sampled runs' temperature (the greedy run's is 0)."""
    top_p: float = 0.95
    """The sampled runs' nucleus mass."""

    def header_settings(self) -> dict[str, object]:
        """What must match for two builds to share a file (problem count and samples may
        grow); ``sampling``: the sampled runs' settings, present once a build samples."""
        out: dict[str, object] = {
            "seed": self.seed, "max_tokens": self.max_tokens, "temperature": 0.0,
            "prompt_version": prompt_version(), "code_timeout_s": self.code_timeout_s}
        if self.samples:
            out[SAMPLING] = {"temperature": self.temperature, "top_p": self.top_p}
        return out


async def call_stage(client: httpx.AsyncClient, base_url: str, model: str, suite: str,
                     role: str, index: int, problem: Problem, history: list[tuple[str, str]],
                     s: Settings, run_seed: int | None) -> Stage:
    """One chat completion for one stage: greedy (``run_seed`` None) or sampled."""
    messages = stage_messages(suite, role, problem.text, history)
    body: dict[str, object] = {
        "model": model, "messages": [{"role": m.role, "content": m.content} for m in messages],
        "temperature": 0.0, "max_tokens": s.max_tokens, "seed": s.seed}
    if run_seed is not None:
        body.update(temperature=s.temperature, top_p=s.top_p,
                    seed=stage_seed(run_seed, index))
    t0 = time.monotonic()
    r = await client.post(f"{base_url}/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{problem.id} stage {index} ({role}): HTTP {r.status_code}: "
                           f"{r.text[:500]}")
    out = r.json()
    choice, usage = out["choices"][0], out["usage"]
    return Stage(index=index, role=role, messages=messages,
                 prompt_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"],
                 output_text=choice["message"]["content"] or "",
                 finish_reason=choice.get("finish_reason") or "", latency_s=time.monotonic() - t0)


async def run_unit(client: httpx.AsyncClient, base_url: str, model: str, problem: Problem,
                   workflow: str, s: Settings, sample: int | None = None) -> Unit:
    """One model's run of one workflow on one problem, judged: the greedy run
    (``sample`` None) or sampled run ``sample``."""
    t0 = time.monotonic()
    seed = None if sample is None else sample_seed(s.seed, problem.id, workflow, model, sample)
    stages: list[Stage] = []
    for i, role in enumerate(WORKFLOWS[s.suite][workflow]):
        history = [(st.role, st.output_text) for st in stages]
        stages.append(await call_stage(client, base_url, model, s.suite, role, i, problem,
                                       history, s, seed))
    verdict = await asyncio.to_thread(judge, problem, stages[-1].output_text, s.code_timeout_s)
    return Unit(key=unit_key(problem.id, workflow, model, sample), problem_id=problem.id,
                workflow=workflow, model=model, user_prompt=problem.text,
                reference=problem.reference, stages=stages, final_answer=verdict.final_answer,
                correct=verdict.correct, score=verdict.score,
                total_output_tokens=sum(st.output_tokens for st in stages),
                latency_s=time.monotonic() - t0, detail=verdict.detail, sample=sample,
                seed=seed)


Todo = list[tuple[Problem, str, int | None]]
"""(problem, workflow, sample index or None for the greedy run) still to run."""


async def run_model(base_url: str, model: str, todo: Todo, s: Settings,
                    writer: TraceWriter) -> None:
    """Run ``todo`` on one engine, appending each unit as it finishes."""
    sem = asyncio.Semaphore(s.concurrency)
    correct = 0
    bar = tqdm(total=len(todo), desc=f"{s.suite} {model}", unit="run", file=sys.stderr,
               dynamic_ncols=True)

    async def one(client: httpx.AsyncClient, problem: Problem, workflow: str,
                  sample: int | None) -> None:
        nonlocal correct
        async with sem:
            unit = await run_unit(client, base_url, model, problem, workflow, s, sample)
        writer.append(unit)
        correct += unit.correct
        bar.update()
        bar.set_postfix(correct=f"{correct}/{bar.n}")

    await run_all(s.concurrency, [lambda c, p=p, w=w, k=k: one(c, p, w, k)
                                  for p, w, k in todo], bar)


async def run_all(concurrency: int,
                  jobs: Sequence[Callable[[httpx.AsyncClient], Awaitable[None]]],
                  bar: tqdm) -> None:
    """Run ``jobs`` at once on one client sized for ``concurrency`` calls (each job limits
    itself); the first failure cancels the rest; the progress bar is closed either way."""
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:
        tasks = [asyncio.create_task(job(client)) for job in jobs]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            bar.close()


def open_trace(out: Path, header: Header) -> set[str]:
    """Create ``out`` with ``header``, or check an existing one's; return its unit keys.

    A cluster with models the existing header does not list (a build that adds a model to
    a trace) has their sources appended to the header, and a first build with samples
    adds the sampling settings to it; either rewrites the file. Sampling settings other
    than the file's are refused like any other setting."""
    if not out.exists() or out.stat().st_size == 0:
        with TraceWriter(out) as w:
            w.append(header)
        return set()
    old, units = read_records(out)
    greedy = {k: v for k, v in header.settings.items() if k != SAMPLING}
    now = msgspec.structs.replace(header, settings=greedy)
    for field in ("suite", "workflows", "settings"):
        was = getattr(old, field)
        if field == "settings":
            was = {k: v for k, v in was.items() if k != SAMPLING}
        if was != getattr(now, field):
            raise SystemExit(f"{out}: was built with a different {field} "
                             f"({was!r}, now {getattr(now, field)!r}); "
                             "use another --out or the original settings")
    sampling = header.settings.get(SAMPLING)
    if sampling is not None and old.settings.get(SAMPLING, sampling) != sampling:
        raise SystemExit(f"{out}: its samples were drawn with different settings "
                         f"({old.settings[SAMPLING]!r}, now {sampling!r}); use another --out "
                         "or the original --temperature and --top-p")
    known = {src.get("name") for src in old.sources}
    new = [src for src in header.sources if src.get("name") not in known]
    settings = old.settings if sampling is None else {**old.settings, SAMPLING: sampling}
    if new or settings != old.settings:
        write_records(out, msgspec.structs.replace(old, sources=old.sources + new,
                                                   settings=settings), units)
        said = [f"lists {', '.join(str(s.get('name')) for s in new)}"] if new else []
        said += [f"records {SAMPLING} {sampling}"] if settings != old.settings else []
        print(f"[trace] {out}: header now {' and '.join(said)}", file=sys.stderr, flush=True)
    return {u.key for u in units}


def build(cluster: Path, s: Settings, out: Path, models: list[str] | None, workflows: list[str],
          command: str) -> None:
    from kernels_bench.lab.trace.engines import describe_model, engine_session
    from launcher.settings import load_launch_config

    cfg = load_launch_config(cluster)
    names = models or [e.name for e in cfg.engines]
    unknown = sorted(set(names) - {e.name for e in cfg.engines})
    if unknown:
        raise SystemExit(f"--models: no engine named {unknown} in {cluster}")
    problems = load_problems(s.suite, s.problems, s.seed)
    header = Header(format=FORMAT, version=VERSION, suite=s.suite,
                    workflows=WORKFLOWS[s.suite], settings=s.header_settings(),
                    sources=[SOURCES[s.suite]] + [describe_model(e) for e in cfg.engines],
                    command=command)
    done = open_trace(out, header)
    runs: list[int | None] = [None, *range(s.samples)]
    for name in names:
        served = cfg.engine(name).served_model_name
        todo: Todo = [(p, w, k) for p in problems for w in workflows for k in runs
                      if unit_key(p.id, w, served, k) not in done]
        total = len(problems) * len(workflows) * len(runs)
        what = "units" if not s.samples else f"units (greedy + {s.samples} samples each)"
        print(f"[trace] {served}: {total - len(todo)}/{total} {what} done, {len(todo)} to run",
              file=sys.stderr, flush=True)
        if not todo:
            continue
        seeded = any(k is not None for _, _, k in todo)
        with engine_session(cfg, name, seeded) as eng, TraceWriter(out) as writer:
            asyncio.run(run_model(eng.base_url, eng.served_model_name, todo, s, writer))
    print(f"[trace] done: {out}", file=sys.stderr, flush=True)
