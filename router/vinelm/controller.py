"""Online control (VineLM section 4): per program, the realised prefix and elapsed time,
and the next invocation's model from the re-rooted subtrie.

Depth of a call: its ``stage_index`` (the program's LLM calls so far, 0-based), else the
number of calls the controller has chosen for the program (a retry, ``attempt > 1``,
keeps the depth of the call it retries). The realised prefix is the models the
controller chose for the program's earlier depths; the elapsed time runs from the
arrival of its first call. With ``reroot`` off (the ablation), a program follows the
plan made at its first call for as long as that plan goes on and its next model is up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping

from router.vinelm.objective import Objective
from router.vinelm.search import Plan, search
from router.vinelm.trie import Trie


class ControlError(ValueError):
    """A call the controller cannot place (message names the workflow field)."""


class NoAdmissibleModel(Exception):
    """No admissible model of the call's stage has a candidate engine (HTTP 503)."""


@dataclass
class ProgramRun:
    workflow: str
    started: float
    last_active: float
    models: dict[int, str] = field(default_factory=dict)
    """Depth -> chosen model."""
    plan: Plan | None = None
    """The plan the last search made for the program."""


class Controller:
    def __init__(self, tries: Mapping[str, Trie], ttl_s: float, reroot: bool = True) -> None:
        self.tries = dict(tries)
        self.ttl_s = ttl_s
        self.reroot = reroot
        self.programs: dict[str, ProgramRun] = {}

    def depth_of(self, program_id: str | None, workflow: str, stage_index: int | None,
                 attempt: int) -> int:
        run = self.programs.get(program_id) if program_id else None
        if stage_index is not None:
            return stage_index
        if run is None or run.workflow != workflow:
            return 0
        n = len(run.models)
        return n - 1 if attempt > 1 and n else n

    def plan(self, program_id: str | None, workflow: str, stage: str | None,
             stage_index: int | None, attempt: int, num_stages: int | None, now: float,
             objective: Objective, delays: Mapping[str, float],
             available: Collection[str]) -> tuple[int, Plan]:
        """(depth, plan) for one call; ControlError when it does not fit the template."""
        trie = self.tries.get(workflow)
        if trie is None:
            raise ControlError(f"'workflow.workflow' {workflow!r} has no VineLM template; "
                               f"templates: {', '.join(sorted(self.tries))}")
        self._expire(now)
        depth = self.depth_of(program_id, workflow, stage_index, attempt)
        if depth >= trie.depth:
            raise ControlError(f"call {depth} of workflow {workflow!r} is beyond its longest "
                               f"run ({trie.depth} LLM calls, loop bound included)")
        expected = trie.invocations[depth].stage
        if stage is not None and stage != expected:
            raise ControlError(f"'workflow.stage' is {stage!r}, but call {depth} of "
                               f"workflow {workflow!r} is stage {expected!r}")
        run = self.programs.get(program_id) if program_id else None
        if run is not None and run.workflow != workflow:
            run = None
        prefix = tuple(run.models.get(d) for d in range(depth)) if run else ()
        if depth and (run is None or None in prefix):
            raise ControlError(f"program {program_id!r}: VineLM has no record of its calls "
                               f"before call {depth} (they expired, went to another "
                               "router, or the program id is missing)")
        elapsed = now - run.started if run and depth else 0.0
        stops = None if num_stages is None else {num_stages}
        allowed = [m for m in trie.invocations[depth].models if m in available]
        if not allowed:
            raise NoAdmissibleModel(f"no admissible model of stage {expected!r} "
                               f"({', '.join(trie.invocations[depth].models)}) is up")
        realised = tuple(m for m in prefix if m is not None)
        if not self.reroot and run is not None and run.plan is not None:
            fixed = run.plan.path
            if len(fixed) > depth and fixed[:depth] == realised and fixed[depth] in allowed:
                return depth, run.plan
        return depth, search(trie, realised, objective, elapsed, delays, stops,
                             first_models=allowed)

    def chosen(self, program_id: str | None, workflow: str, depth: int, model: str,
               now: float, plan: Plan | None = None) -> None:
        """Record the model of call ``depth`` of ``program_id`` and the plan it came from
        (a first call of a program that had gone further starts a new run)."""
        if not program_id:
            return
        run = self.programs.get(program_id)
        if run is None or run.workflow != workflow or (depth == 0 and len(run.models) > 1):
            run = self.programs[program_id] = ProgramRun(workflow, now, now)
        run.models[depth] = model
        run.plan = plan
        for d in [d for d in run.models if d > depth]:
            del run.models[d]
        run.last_active = now

    def finished(self, program_id: str | None) -> None:
        if program_id:
            self.programs.pop(program_id, None)

    def _expire(self, now: float) -> None:
        for pid in [p for p, r in self.programs.items() if now - r.last_active > self.ttl_s]:
            del self.programs[pid]
