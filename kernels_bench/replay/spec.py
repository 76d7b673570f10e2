"""What a replay compares: policy specs (``chimera:stjf``, ``vllm:fcfs``, ``oracle``) and
the map from the cluster's served models to the trace's models.

Policy spec grammar: ``ROUTER[:SCHED][+oracle]``.

- ``ROUTER``: a router policy (``router.policies``), e.g. ``chimera``, ``vllm``;
- ``SCHED``: the engines' scheduler (``stjf``, ``fcfs``, ``priority``, ``mlfq``); left out,
  the cluster file's ``sched_policy`` of each engine applies;
- ``+oracle``: the client sends the true remaining output tokens of the workflow (from the
  trace, for each model) as the engine priority, which the router forwards for the model
  it picks (``allow_client_priority`` is turned on for that run).

``oracle`` alone is ``chimera:stjf+oracle``: Chimera's routing with STJF on true lengths.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ORACLE = "oracle"
ORACLE_ROUTER = "chimera"
ORACLE_SCHED = "stjf"


class SpecError(ValueError):
    """A bad ``--policies`` or ``--model-map`` value; the message says which and why."""


@dataclass(frozen=True)
class PolicySpec:
    """One compared configuration: router policy, engine scheduler, oracle priorities."""

    label: str
    """As given on the command line; names the run in every output."""
    router: str
    sched: str | None
    """Engine scheduler for every engine; ``None``: the cluster file's."""
    oracle: bool = False


def parse_policy(text: str, routers: Iterable[str], scheds: Iterable[str]) -> PolicySpec:
    """Parse ``ROUTER[:SCHED][+oracle]`` (or ``oracle[:SCHED]``) against the known names."""
    routers, scheds = list(routers), list(scheds)
    body, plus, suffix = text.partition("+")
    if plus and suffix != ORACLE:
        raise SpecError(f"policy {text!r}: the only suffix is '+{ORACLE}'")
    router, colon, sched = body.partition(":")
    oracle = bool(plus)
    if router == ORACLE:
        if oracle:
            raise SpecError(f"policy {text!r}: '{ORACLE}' already implies +{ORACLE}")
        router, oracle, sched = ORACLE_ROUTER, True, sched or ORACLE_SCHED
    if router not in routers:
        raise SpecError(f"policy {text!r}: unknown router policy {router!r}; known: "
                        f"{', '.join(routers)} (or '{ORACLE}')")
    if colon and sched not in scheds:
        raise SpecError(f"policy {text!r}: unknown engine scheduler {sched!r}; known: "
                        f"{', '.join(scheds)}")
    return PolicySpec(text, router, sched or None, oracle)


def parse_policies(texts: Sequence[str], routers: Iterable[str],
                   scheds: Iterable[str]) -> list[PolicySpec]:
    """Every spec, checked, with no label twice."""
    specs = [parse_policy(t, routers, scheds) for t in texts]
    seen: set[str] = set()
    for s in specs:
        if s.label in seen:
            raise SpecError(f"policy {s.label!r} is given twice")
        seen.add(s.label)
    return specs


def parse_model_map(items: Sequence[str]) -> dict[str, str]:
    """``["a=X,b=Y", "c=Z"]`` -> ``{"a": "X", "b": "Y", "c": "Z"}`` (served -> trace)."""
    out: dict[str, str] = {}
    for item in (p.strip() for text in items for p in text.split(",")):
        if not item:
            continue
        served, eq, traced = (s.strip() for s in item.partition("="))
        if not (eq and served and traced):
            raise SpecError(f"--model-map {item!r}: expected SERVED=TRACE_MODEL")
        if served in out:
            raise SpecError(f"--model-map: {served!r} is mapped twice")
        out[served] = traced
    return out


def resolve_model_map(served: Sequence[str], given: Mapping[str, str],
                      trace_models: Sequence[str]) -> dict[str, str]:
    """Trace model of every served model: as mapped (matched case-insensitively when the
    spelling is unique), else the trace model of the same name; SpecError otherwise."""
    unknown = sorted(set(given) - set(served))
    if unknown:
        raise SpecError(f"--model-map names {', '.join(unknown)}, which the cluster does not "
                        f"serve (served models: {', '.join(served)})")
    by_lower: dict[str, list[str]] = {}
    for m in trace_models:
        by_lower.setdefault(m.lower(), []).append(m)
    out = {}
    for name in served:
        want = given.get(name, name)
        if want in trace_models:
            out[name] = want
            continue
        matches = by_lower.get(want.lower(), [])
        if len(matches) != 1:
            problem = (f"is mapped to {want!r}, which is not a model of the trace"
                       if name in given else "is not a model of the trace; map it with "
                       "--model-map SERVED=TRACE_MODEL")
            raise SpecError(f"served model {name!r} {problem} (trace models: "
                            f"{', '.join(trace_models)})")
        out[name] = matches[0]
    return out
