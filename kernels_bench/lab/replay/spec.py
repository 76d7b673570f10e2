"""What a replay compares: policy specs (``chimera:stjf``, ``vllm:fcfs``, ``oracle``); the map
from the cluster's served models to the trace's models is ``kernels_bench.lib.model_map``.

Policy spec grammar: ``ROUTER[-static][:SCHED][+oracle][@KEY=VALUE,...]``.

- ``ROUTER``: a router policy (``router.policies``), e.g. ``chimera``, ``vllm``;
- ``-static``: the ablation of a predictor-backed policy on static priors (its
  ``static_prior`` tables) instead of the trained predictors the replay gives the others;
- ``SCHED``: the engines' scheduler (``stjf``, ``fcfs``, ``priority``, ``mlfq``), or
  ``vllm-fcfs`` / ``vllm-priority``: every local engine a stock vLLM server (``kind =
  "vllm"``, read by its ``/metrics``) with that scheduler; left out, the cluster file's
  ``sched_policy`` of each engine applies;
- ``+oracle``: the client sends the true remaining output tokens of the workflow (from the
  trace, for each model) as the engine priority, which the router forwards for the model
  it picks (``allow_client_priority`` is turned on for that run);
- ``@KEY=VALUE,...``: settings of the router policy for this spec only, over the cluster
  file's ``[router.policies.ROUTER]`` (values in TOML syntax, without commas), e.g.
  ``chimera:stjf@tau=0.5,delta_s=0.1``: a sweep on one engine start. ``POLICY.KEY``
  sets another policy's table instead, e.g. the replica chooser of Chimera:
  ``chimera:stjf@lmetric.count_arriving=true``. The KV retention
  keys of the engines (``router.config.engines.RETENTION_KEYS``) set every local engine
  instead, e.g. ``chimera:stjf@max_protected_programs=0`` (retention off: vLLM's LRU
  alone) or ``chimera:stjf@retention_ttl_only=true``.

``oracle`` alone is ``chimera:stjf+oracle``: Chimera's routing with STJF on true lengths
(``oracle-static``: on static priors).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kernels_bench.lib.cluster import STOCK_PREFIX
from router.config.engines import RETENTION_KEYS

ORACLE = "oracle"
STATIC = "-static"
ORACLE_ROUTER = "chimera"
ORACLE_SCHED = "stjf"


class SpecError(ValueError):
    """A bad ``--policies`` value; the message says which and why."""


@dataclass(frozen=True)
class PolicySpec:
    """One compared configuration: router policy, engine scheduler, oracle priorities."""

    label: str
    """As given on the command line; names the run in every output."""
    router: str
    sched: str | None
    """Engine scheduler for every engine; ``None``: the cluster file's."""
    oracle: bool = False
    static: bool = False
    """Static priors instead of trained predictors (the ``-static`` ablation)."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """Policy settings of this spec, over the cluster file's."""
    engine_overrides: tuple[tuple[str, Any], ...] = ()
    """Engine settings of this spec (``RETENTION_KEYS``), over every local engine's."""


def parse_policy(text: str, routers: Iterable[str], scheds: Iterable[str]) -> PolicySpec:
    """Parse ``ROUTER[-static][:SCHED][+oracle][@KEY=VALUE,...]`` (or
    ``oracle[-static][:SCHED]...``) against the known names."""
    routers, scheds = list(routers), list(scheds)
    head, _, settings = text.partition("@")
    given = parse_overrides(text, settings)
    overrides = tuple((k, v) for k, v in given if k not in RETENTION_KEYS)
    engine_overrides = tuple((k, v) for k, v in given if k in RETENTION_KEYS)
    body, plus, suffix = head.partition("+")
    if plus and suffix != ORACLE:
        raise SpecError(f"policy {text!r}: the only suffix is '+{ORACLE}'")
    router, colon, sched = body.partition(":")
    static = router.endswith(STATIC)
    router = router.removesuffix(STATIC)
    oracle = bool(plus)
    if router == ORACLE:
        if oracle:
            raise SpecError(f"policy {text!r}: '{ORACLE}' already implies +{ORACLE}")
        router, oracle, sched = ORACLE_ROUTER, True, sched or ORACLE_SCHED
    if router not in routers:
        raise SpecError(f"policy {text!r}: unknown router policy {router!r}; known: "
                        f"{', '.join(routers)} (or '{ORACLE}')")
    for key, _ in overrides:
        table, dot, _ = key.partition(".")
        if dot and table not in routers:
            raise SpecError(f"policy {text!r}: setting {key!r} names no router policy "
                            f"{table!r}; known: {', '.join(routers)}")
    if colon and sched not in scheds:
        raise SpecError(f"policy {text!r}: unknown engine scheduler {sched!r}; known: "
                        f"{', '.join(scheds)}")
    if engine_overrides and (sched or "").startswith(STOCK_PREFIX):
        raise SpecError(f"policy {text!r}: stock vLLM engines have no KV retention to set")
    if dict(engine_overrides).get("admit_returning_first") and sched not in ("", "stjf"):
        raise SpecError(f"policy {text!r}: admit_returning_first reorders STJF's queue; "
                        f"the {sched} scheduler has none")
    return PolicySpec(text, router, sched or None, oracle, static, overrides,
                      engine_overrides)


def parse_overrides(text: str, settings: str) -> tuple[tuple[str, Any], ...]:
    """``tau=0.5,delta_s=0.1`` -> ``(("tau", 0.5), ("delta_s", 0.1))`` (TOML values; the
    router checks names and ranges)."""
    out: list[tuple[str, Any]] = []
    for item in filter(None, (p.strip() for p in settings.split(","))):
        key, eq, value = (x.strip() for x in item.partition("="))
        try:
            parsed = tomllib.loads(f"v = {value}")["v"] if eq and key else None
        except tomllib.TOMLDecodeError:
            parsed = None
        if parsed is None:
            raise SpecError(f"policy {text!r}: setting {item!r} is not KEY=VALUE with a "
                            f"TOML value (e.g. tau=0.5)")
        if key in dict(out):
            raise SpecError(f"policy {text!r}: setting {key!r} is given twice")
        out.append((key, parsed))
    return tuple(out)


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
