"""Workflow templates (VineLM section 3): stages, admissible models, one bounded loop.

A template is one ``[router.policies.vinelm.workflows.<name>]`` table::

    stages = [
      {name = "planner", models = ["small", "big"]},
      {name = "solver", models = ["small", "big"], answers = true},
      {name = "verifier", models = ["small", "big"]},
    ]
    loop = {from = "verifier", to = "solver", max_iterations = 1}

An LLM stage lists its admissible models; a tool stage (``tool = true``) has a fixed
``latency_s`` and ``cost``. ``answers = true`` marks the stages whose output is the
workflow's answer (success is judged after them). The loop lets stage ``from`` send the
work back to stage ``to`` (earlier) at most ``max_iterations`` times; ``from`` runs only
while it can still send work back, so the longest run is

    stages before `to`, [to .. from-1], ([from], [to .. from-1]) x max_iterations,
    stages after `from`

(math, ``max_iterations = 1``: Planner, Solver, Verifier, Solver, the trace builder's
``plan_solve_verify_solve``). Every LLM stage invocation of that run is one decision of
the execution trie, so a stage invoked twice is two decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


class TemplateError(ValueError):
    """A bad template entry; ``key`` is its path under the policy table."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message

MAX_TRIE_NODES = 200_000
"""Largest execution trie a template may span (nodes over all depths)."""

_STAGE_KEYS = ("name", "tool", "models", "answers", "latency_s", "cost")
_LOOP_KEYS = ("from", "to", "max_iterations")


@dataclass(frozen=True)
class StageSpec:
    name: str
    tool: bool
    models: tuple[str, ...]
    """Admissible models (LLM stages); empty for a tool stage."""
    answers: bool
    latency_s: float
    """Fixed latency of a tool stage."""
    cost: float
    """Fixed cost of a tool stage."""


@dataclass(frozen=True)
class LoopSpec:
    from_stage: str
    to_stage: str
    max_iterations: int


@dataclass(frozen=True)
class Invocation:
    """One LLM stage invocation of the longest run: one trie depth."""

    stage: str
    models: tuple[str, ...]
    answers: bool
    tool_latency_s: float
    """Latency of the tool stages folded into this invocation (those just before it,
    or after it when it is the last)."""
    tool_cost: float


@dataclass(frozen=True)
class WorkflowTemplate:
    name: str
    stages: tuple[StageSpec, ...]
    loop: LoopSpec | None

    def run(self) -> list[StageSpec]:
        """The stages of the longest run, in order."""
        st = list(self.stages)
        if self.loop is None:
            return st
        names = [s.name for s in st]
        t, f = names.index(self.loop.to_stage), names.index(self.loop.from_stage)
        body = st[t:f]
        return st[:t] + body + (st[f:f + 1] + body) * self.loop.max_iterations + st[f + 1:]

    def invocations(self) -> list[Invocation]:
        """The LLM invocations of the longest run with the tool stages folded in."""
        out: list[Invocation] = []
        lat = cost = 0.0
        for s in self.run():
            if s.tool:
                lat, cost = lat + s.latency_s, cost + s.cost
                continue
            out.append(Invocation(s.name, s.models, s.answers, lat, cost))
            lat = cost = 0.0
        if out and (lat or cost):
            last = out[-1]
            out[-1] = Invocation(last.stage, last.models, last.answers,
                                 last.tool_latency_s + lat, last.tool_cost + cost)
        return out

    def models(self) -> list[str]:
        return sorted({m for s in self.stages for m in s.models})

    def signature(self) -> list[list[Any]]:
        """What a profile must match: each depth's stage and admissible models."""
        return [[i.stage, list(i.models)] for i in self.invocations()]


def parse_templates(table: Mapping[str, Any]) -> dict[str, WorkflowTemplate]:
    """Templates by name from the ``workflows`` table; TemplateError naming the key."""
    return {name: parse_template(name, raw) for name, raw in table.items()}


def parse_template(name: str, raw: Any) -> WorkflowTemplate:
    key = f"workflows.{name}"
    if not isinstance(raw, Mapping):
        raise TemplateError(key, "must be a table with 'stages' (and optionally 'loop')")
    for k in raw:
        if k not in ("stages", "loop"):
            raise TemplateError(f"{key}.{k}", "unknown key; known keys: stages, loop")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise TemplateError(f"{key}.stages", "must be a non-empty array of stage tables")
    stages = tuple(_stage(f"{key}.stages[{i}]", s) for i, s in enumerate(stages_raw))
    seen: set[str] = set()
    for i, s in enumerate(stages):
        if s.name in seen:
            raise TemplateError(f"{key}.stages[{i}].name", f"duplicate stage name {s.name!r}")
        seen.add(s.name)
    if all(s.tool for s in stages):
        raise TemplateError(f"{key}.stages", "needs at least one LLM stage")
    if not any(s.answers for s in stages):
        raise TemplateError(f"{key}.stages", "no stage has answers = true: mark the stage "
                           "whose output is the workflow's answer")
    loop = None if raw.get("loop") is None else _loop(f"{key}.loop", raw["loop"], stages)
    t = WorkflowTemplate(name, stages, loop)
    invs = t.invocations()
    nodes, width = 0, 1
    for inv in invs:
        width *= len(inv.models)
        nodes += width
    if nodes > MAX_TRIE_NODES:
        where = f"{key}.loop.max_iterations" if loop else f"{key}.stages"
        raise TemplateError(where, f"the execution trie would have {nodes} nodes (limit "
                           f"{MAX_TRIE_NODES}); lower the loop bound or the admissible models")
    return t


def _stage(key: str, raw: Any) -> StageSpec:
    if not isinstance(raw, Mapping):
        raise TemplateError(key, "must be a table {name, models} or {name, tool = true}")
    for k in raw:
        if k not in _STAGE_KEYS:
            raise TemplateError(f"{key}.{k}", "unknown key; known keys: " + ", ".join(_STAGE_KEYS))
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise TemplateError(f"{key}.name", "must be a non-empty string")
    tool = _bool(f"{key}.tool", raw.get("tool", False))
    answers = _bool(f"{key}.answers", raw.get("answers", False))
    if tool:
        if answers:
            raise TemplateError(f"{key}.answers", "a tool stage cannot give the answer; mark "
                                "the LLM stage whose output is judged")
        if "models" in raw:
            raise TemplateError(f"{key}.models", "a tool stage has no models")
        return StageSpec(name, True, (), answers, _nonneg(f"{key}.latency_s",
                                                         raw.get("latency_s", 0.0)),
                         _nonneg(f"{key}.cost", raw.get("cost", 0.0)))
    for k in ("latency_s", "cost"):
        if k in raw:
            raise TemplateError(f"{key}.{k}", "only a tool stage (tool = true) has a fixed "
                               f"{k}; an LLM stage's comes from the profile")
    models = raw.get("models")
    if not isinstance(models, list) or not models or \
            not all(isinstance(m, str) and m for m in models):
        raise TemplateError(f"{key}.models", "must be a non-empty array of served model names")
    if len(set(models)) != len(models):
        raise TemplateError(f"{key}.models", "lists a model twice")
    return StageSpec(name, False, tuple(models), answers, 0.0, 0.0)


def _loop(key: str, raw: Any, stages: Sequence[StageSpec]) -> LoopSpec:
    if not isinstance(raw, Mapping):
        raise TemplateError(key, "must be a table {from, to, max_iterations}")
    for k in raw:
        if k not in _LOOP_KEYS:
            raise TemplateError(f"{key}.{k}", "unknown key; known keys: " + ", ".join(_LOOP_KEYS))
    names = [s.name for s in stages]
    for k in ("from", "to"):
        if raw.get(k) not in names:
            raise TemplateError(f"{key}.{k}", f"must name a stage ({', '.join(names)}), got "
                               f"{raw.get(k)!r}")
    f, t = names.index(raw["from"]), names.index(raw["to"])
    if t >= f:
        raise TemplateError(f"{key}.to", f"stage {raw['to']!r} must come before "
                           f"{raw['from']!r} (a loop sends work back)")
    if all(s.tool for s in stages[t:f]):
        raise TemplateError(f"{key}.to", "the loop body (stages 'to' up to 'from') has no "
                           "LLM stage")
    n = raw.get("max_iterations")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise TemplateError(f"{key}.max_iterations", f"must be an integer >= 0, got {n!r}")
    return LoopSpec(raw["from"], raw["to"], n)


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TemplateError(key, f"must be true or false, got {v!r}")
    return v


def _nonneg(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise TemplateError(key, f"must be a finite number >= 0, got {v!r}")
    return float(v)
