"""``python -m kernels_bench vinelm collect``: real executions of a workflow trie, for profiling
and for its ground truth.

For every problem, every node of the trie is executed once, parents before children
(checkpoint reuse: a node continues from its parent's stage outputs), except below a
success: there the workflow has stopped, so nothing is run. That is exhaustive
profiling's ground truth for the accuracy of every path; cascade sampling replayed over
the same records executes exactly what it would have executed live (a subset).

The work goes depth by depth; within a depth it is grouped by the node's last model and
each group runs on that model's engine (started from the cluster file by the trace
builder's ``engine_session``, one engine at a time, so two big models never share the
machine), with up to ``--concurrency`` calls in flight. Prompts, greedy settings and the
judge are the trace builder's (``kernels_bench.lab.trace.build.call_stage``,
``kernels_bench.lab.trace.suites.judge``). Single-model prefixes are taken from a trace file
when one is given (its recorded stages, judged here stage by stage). Every execution is
appended to ``--out`` at once (fsynced); a restarted collection skips what is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import httpx
from tqdm import tqdm

from kernels_bench.lab.trace.build import Settings, call_stage, run_all
from kernels_bench.lab.trace.engines import EngineHandle, describe_model, engine_session
from kernels_bench.lab.trace.suites import SOURCES, Problem, judge, load_problems
from kernels_bench.lab.trace.workflows import ROLE_PROMPTS
from kernels_bench.lab.vinelm.executions import (FORMAT, VERSION, ExecHeader, Execution,
                                                 read_executions, succeeded_by)
from launcher.settings import load_launch_config
from router.trace_format import Trace, TraceWriter, load_trace
from router.vinelm.template import Invocation, WorkflowTemplate
from router.vinelm.trie import Path_

Table = dict[tuple[str, Path_], Execution]


def trace_executions(trace: Trace, invocations: Sequence[Invocation],
                     problems: dict[str, Problem], code_timeout_s: float) -> list[Execution]:
    """Single-model nodes from a trace: the runs of the workflow whose roles are the
    template's longest run, each stage judged on its own output when it answers."""
    roles = [inv.stage for inv in invocations]
    flows = [w for w, r in trace.header.workflows.items() if r == roles]
    if not flows:
        raise ValueError(f"the trace has no workflow with the stages {roles} (it has "
                         f"{trace.header.workflows})")
    out = []
    for run in trace.runs:
        if run.workflow != flows[0] or run.problem_id not in problems:
            continue
        for model, mr in run.models.items():
            if any(model not in inv.models for inv in invocations):
                continue
            for k, (inv, st) in enumerate(zip(invocations, mr.stages), start=1):
                answer, detail, ok = None, "", False
                if inv.answers:
                    v = judge(problems[run.problem_id], st.output_text, code_timeout_s)
                    answer, detail, ok = v.final_answer, v.detail, v.correct
                out.append(Execution(run.problem_id, [model] * k, st, ok, answer, detail,
                                     "trace"))
                if ok:
                    break
    return out


def pending(table: Table, problems: Sequence[str], invocations: Sequence[Invocation],
            depth: int) -> dict[str, list[tuple[str, Path_]]]:
    """Nodes of ``depth`` (1-based) still to run, by model: children of recorded nodes
    that did not succeed (absorbing), and not recorded themselves."""
    out: dict[str, list[tuple[str, Path_]]] = defaultdict(list)
    parents: list[tuple[str, Path_]] = (
        [(p, ()) for p in problems] if depth == 1 else
        [k for k in table if len(k[1]) == depth - 1 and k[0] in problems])
    for problem, parent in sorted(parents):
        if succeeded_by(table, problem, parent):
            continue
        for m in invocations[depth - 1].models:
            if (problem, parent + (m,)) not in table:
                out[m].append((problem, parent + (m,)))
    return out


async def run_nodes(base_url: str, model: str, nodes: list[tuple[str, Path_]],
                    problems: dict[str, Problem], invocations: Sequence[Invocation],
                    table: Table, settings: Settings, writer: TraceWriter, desc: str) -> None:
    """Execute ``nodes`` (all of one depth, last model ``model``) on one engine."""
    sem = asyncio.Semaphore(settings.concurrency)
    bar = tqdm(total=len(nodes), desc=desc, unit="call", file=sys.stderr, dynamic_ncols=True)

    async def one(client: httpx.AsyncClient, problem: str, prefix: Path_) -> None:
        inv, p = invocations[len(prefix) - 1], problems[problem]
        history = [(table[problem, prefix[:j]].stage.role,
                    table[problem, prefix[:j]].stage.output_text)
                   for j in range(1, len(prefix))]
        async with sem:
            st = await call_stage(client, base_url, model, settings.suite, inv.stage,
                                  len(prefix) - 1, p, history, settings, None)
        answer, detail, ok = None, "", False
        if inv.answers:
            v = await asyncio.to_thread(judge, p, st.output_text, settings.code_timeout_s)
            answer, detail, ok = v.final_answer, v.detail, v.correct
        rec = Execution(problem, list(prefix), st, ok, answer, detail, "engine")
        writer.append(rec)
        table[problem, prefix] = rec
        bar.update()

    await run_all(settings.concurrency,
                  [lambda c, pr=pr, px=px: one(c, pr, px) for pr, px in nodes], bar)


def open_executions(out: Path, header: ExecHeader) -> Table:
    """Create ``out`` with ``header`` or check an existing one's; its executions."""
    if not out.exists() or out.stat().st_size == 0:
        with TraceWriter(out) as w:
            w.append(header)
        return {}
    old, table = read_executions(out)
    for field in ("suite", "workflow", "signature", "settings"):
        if getattr(old, field) != getattr(header, field):
            raise SystemExit(f"{out}: was collected with a different {field} "
                             f"({getattr(old, field)!r}, now {getattr(header, field)!r}); "
                             "use another --out or the original settings")
    return table


def collect(cluster: Path, template: WorkflowTemplate, settings: Settings, out: Path,
            trace_path: Path | None, command: str) -> Table:
    """Run every pending node of ``settings.problems`` problems; return the table."""
    invs = template.invocations()
    unknown = sorted({i.stage for i in invs} - set(ROLE_PROMPTS[settings.suite]))
    if unknown:
        raise ValueError(f"stages {', '.join(unknown)} have no {settings.suite} role prompt; "
                         f"the trace builder's roles are {', '.join(ROLE_PROMPTS[settings.suite])}")
    cfg = load_launch_config(cluster)
    engine_of = {e.served_model_name: e.name for e in cfg.engines}
    missing = [m for m in template.models() if m not in engine_of]
    if missing:
        raise ValueError(f"{cluster}: no engine serves {', '.join(missing)}")
    problems = {p.id: p for p in load_problems(settings.suite, settings.problems, settings.seed)}
    header = ExecHeader(FORMAT, VERSION, settings.suite, template.name, template.signature(),
                        settings.header_settings(),
                        [SOURCES[settings.suite]] + [describe_model(cfg.engine(engine_of[m]))
                                                     for m in template.models()], command)
    table = open_executions(out, header)
    if trace_path is not None:
        trace = load_trace(trace_path)
        if trace.header.settings != header.settings:
            raise SystemExit(f"{trace_path}: built with settings {trace.header.settings}, "
                             f"not {header.settings}: its stages are not these executions")
        new = [e for e in trace_executions(trace, invs, problems, settings.code_timeout_s)
               if (e.problem_id, tuple(e.prefix)) not in table]
        with TraceWriter(out) as w:
            for e in new:
                w.append(e)
                table[e.problem_id, tuple(e.prefix)] = e
        print(f"[collect] {len(new)} single-model executions from {trace_path}",
              file=sys.stderr, flush=True)
    ids = list(problems)
    with contextlib.ExitStack() as stack:
        running: tuple[str, EngineHandle] | None = None
        for depth in range(1, len(invs) + 1):
            todo = pending(table, ids, invs, depth)
            order = sorted(todo, key=lambda m: (running is None or m != running[0], m))
            for model in order:
                if running is None or running[0] != model:
                    stack.close()
                    eng = stack.enter_context(engine_session(cfg, engine_of[model]))
                    running = (model, eng)
                with TraceWriter(out) as writer:
                    asyncio.run(run_nodes(running[1].base_url, model, todo[model], problems,
                                          invs, table, settings, writer,
                                          f"depth {depth} {invs[depth - 1].stage} {model}"))
    print(f"[collect] done: {len(table)} executions in {out}", file=sys.stderr, flush=True)
    return table
