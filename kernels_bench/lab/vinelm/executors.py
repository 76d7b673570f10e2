"""Executors for profiling: recorded traces (a table) and real engines.

- ``TableExecutor`` answers from a table of recorded outcomes. ``trace_table`` fills it
  from ``data/traces/*.jsonl.gz``: every unit there is *one model's run of a whole
  workflow*, so only single-model prefixes are recorded (the exhaustive ground truth
  the traces give is for single-model paths only); a mixed prefix raises
  ``MissingExecution``.
- ``EngineExecutor`` runs the invocations on real engines through the trace builder's
  stage runner (``kernels_bench.lab.trace.build.call_stage``: the same prompts, greedy, the
  same judge), keeping each prefix's stage outputs as the checkpoint its children
  continue from.

Cost of an invocation: prompt_tokens x prompt_cost_per_1k[m] / 1000 + output_tokens x
output_cost_per_1k[m] / 1000; latency: the call's wall time (traces: the recorded one).
``success``: whether the answer after the invocation is right (always False after a
non-answering invocation whose parent failed; profilers make success absorbing).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from router.vinelm.profiling import MissingExecution, Outcome
from router.vinelm.template import Invocation
from router.vinelm.trie import Path_


@dataclass(frozen=True)
class Prices:
    prompt_per_1k: Mapping[str, float]
    output_per_1k: Mapping[str, float]

    def cost(self, model: str, prompt_tokens: int, output_tokens: int) -> float:
        return (prompt_tokens * self.prompt_per_1k[model]
                + output_tokens * self.output_per_1k[model]) / 1000.0

    def check(self, models: Sequence[str]) -> None:
        for key, table in (("prompt_cost_per_1k", self.prompt_per_1k),
                           ("output_cost_per_1k", self.output_per_1k)):
            missing = [m for m in models if m not in table]
            if missing:
                raise ValueError(f"router.policies.vinelm.{key}: no price for "
                                 f"{', '.join(missing)}")


class TableExecutor:
    def __init__(self, table: Mapping[tuple[str, Path_], Outcome], what: str) -> None:
        self.table, self.what = dict(table), what

    def run(self, problem: str, prefix: Path_) -> Outcome:
        out = self.table.get((problem, prefix))
        if out is None:
            raise MissingExecution(f"{self.what} has no execution of {list(prefix)} for "
                                   f"problem {problem!r}")
        return out


def trace_table(trace: Any, invocations: Sequence[Invocation], prices: Prices
                ) -> tuple[TableExecutor, list[str]]:
    """Single-model prefixes of ``invocations`` from a loaded trace, and the problems
    whose every single-model prefix is recorded (every model finished the workflows that
    cover the longest run). A prefix's invocation is taken from a workflow whose roles
    begin with the prefix's stages; its success is judged only where such a workflow
    ends there (else: an answering stage nobody judged is an error)."""
    stages = [inv.stage for inv in invocations]
    flows = trace.header.workflows
    wanted = sorted({m for inv in invocations for m in inv.models})
    missing = [m for m in wanted if m not in trace.models]
    if missing:
        raise ValueError(f"the trace has no runs of {', '.join(missing)} (it holds "
                         f"{', '.join(trace.models)}): the template's models must be the "
                         "trace's served model names")
    table: dict[tuple[str, Path_], Outcome] = {}
    by_problem: dict[str, dict[str, Any]] = {}
    for run in trace.complete_runs():
        by_problem.setdefault(run.problem_id, {})[run.workflow] = run
    covered = []
    for problem, runs in by_problem.items():
        for k in range(1, len(stages) + 1):
            longer = [w for w in runs if flows[w][:k] == stages[:k]]
            exact = [w for w in longer if len(flows[w]) == k]
            if not longer:
                break
            for model in wanted:
                st = runs[longer[0]].models[model].stages[k - 1]
                if invocations[k - 1].answers:
                    if not exact:
                        raise ValueError(f"trace has no workflow ending at {stages[:k]}: "
                                         "cannot judge that answering invocation")
                    ok = runs[exact[0]].models[model].correct
                else:
                    ok = False
                table[problem, (model,) * k] = Outcome(
                    ok, prices.cost(model, st.prompt_tokens, st.output_tokens), st.latency_s)
        else:
            covered.append(problem)
    return TableExecutor(table, "the trace (single-model runs only)"), sorted(covered)


class EngineExecutor:
    """Real executions through ``base_url`` (a hetserve router or an OpenAI server that
    serves every admissible model by name)."""

    def __init__(self, base_url: str, suite: str, problems: Mapping[str, Any],
                 invocations: Sequence[Invocation], prices: Prices, max_tokens: int = 512,
                 seed: int = 0, code_timeout_s: float = 10.0) -> None:
        from kernels_bench.lab.trace.build import Settings
        from kernels_bench.lab.trace.workflows import ROLE_PROMPTS

        unknown = sorted({i.stage for i in invocations} - set(ROLE_PROMPTS[suite]))
        if unknown:
            raise ValueError(f"stages {', '.join(unknown)} have no {suite} role prompt; the "
                             f"trace builder's roles are {', '.join(ROLE_PROMPTS[suite])}")
        self.base_url, self.suite = base_url.rstrip("/"), suite
        self.problems, self.invocations, self.prices = problems, invocations, prices
        self.settings = Settings(suite, len(problems), seed, max_tokens, 1, code_timeout_s)
        self.checkpoints: dict[tuple[str, Path_], list[tuple[str, str]]] = {}
        self.loop = asyncio.new_event_loop()

    def run(self, problem: str, prefix: Path_) -> Outcome:
        return self.loop.run_until_complete(self._run(problem, prefix))

    async def _run(self, problem: str, prefix: Path_) -> Outcome:
        import httpx

        from kernels_bench.lab.trace.build import call_stage
        from kernels_bench.lab.trace.suites import judge

        history = self.checkpoints.get((problem, prefix[:-1]), []) if len(prefix) > 1 else []
        if len(prefix) > 1 and (problem, prefix[:-1]) not in self.checkpoints:
            raise MissingExecution(f"no checkpoint of {list(prefix[:-1])} for {problem!r}: "
                                   "run the parent prefix first")
        inv, p = self.invocations[len(prefix) - 1], self.problems[problem]
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0)) as client:
            st = await call_stage(client, self.base_url, prefix[-1], self.suite, inv.stage,
                                  len(prefix) - 1, p, history, self.settings, None)
        self.checkpoints[problem, prefix] = history + [(inv.stage, st.output_text)]
        ok = False
        if inv.answers:
            verdict = await asyncio.to_thread(judge, p, st.output_text,
                                              self.settings.code_timeout_s)
            ok = verdict.correct
        return Outcome(ok, self.prices.cost(prefix[-1], st.prompt_tokens, st.output_tokens),
                       st.latency_s)

    def close(self) -> None:
        self.loop.close()
