"""The workflow block: a ``workflow`` object in the body (what OpenAI clients send through
``extra_body``) or ``X-Hetserve-*`` headers, typed as ``Workflow``; a field given in both
places takes the body's value. See ``docs/router.md`` for the field table."""

from __future__ import annotations

from typing import Annotated, Any, Mapping

from msgspec import UNSET, Meta, Struct, UnsetType

from router.admission.convert import Fields, bad, convert
from router.request import MAX_LABEL_CHARS, MAX_STAGES
from router.vinelm.objective import (MAX_NUMBER, Objective, ObjectiveError,
                                     objective_from_header, parse_objective)
from scheduler_patches.contract import MAX_EXPECTED_RETURN_S

Label = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
Weight = Annotated[float, Meta(ge=0.0, le=MAX_NUMBER)]


class Workflow(Struct, forbid_unknown_fields=True):
    """The workflow fields of one call; a field not given is ``UNSET``. The messages
    name a field by where it came from: ``workflow.<field>`` or its header."""

    program_id: Label | UnsetType = UNSET
    workflow: Label | UnsetType = UNSET
    stage: Label | UnsetType = UNSET
    stage_index: Annotated[int, Meta(ge=0, le=MAX_STAGES - 1)] | UnsetType = UNSET
    num_stages: Annotated[int, Meta(ge=1, le=MAX_STAGES)] | UnsetType = UNSET
    final: bool | UnsetType = UNSET
    budget: Weight | UnsetType = UNSET
    weights: dict[str, Weight] | UnsetType = UNSET
    attempt: Annotated[int, Meta(ge=1, le=MAX_STAGES)] | UnsetType = UNSET
    tried_models: list[Annotated[str, Meta(min_length=1)]] | UnsetType = UNSET
    checked: bool | UnsetType = UNSET
    """The agent checks the program's final answer (its tests, a verifier) and tries again
    when the check fails; ``false``: it has no check (``cascade`` then starts at the top)."""
    objective: Any = UNSET
    """Checked by ``router.vinelm.objective.parse_objective``."""
    expected_return_s: Annotated[float, Meta(ge=0.0, le=MAX_EXPECTED_RETURN_S)] | UnsetType = UNSET
    """Seconds from this call's end to the program's next call (the engine keeps the
    program's KV cache about that long; ``scheduler_patches.contract``)."""


WORKFLOW_FIELDS: tuple[str, ...] = Workflow.__struct_fields__
"""The workflow fields, in the order the messages list them."""

RANKING_FIELDS = ("workflow", "stage", "stage_index", "num_stages", "final",
                  "expected_return_s")
"""Workflow fields that rank a call (its predicted remaining tokens, hence its engine
priority: "final stage" buys a high one) or claim engine memory (a non-final stage and
its expected return keep the program's KV cache): used only from trusted callers
(``router.auth``); an untrusted caller's are dropped and the router predicts alone."""

HEADER_PREFIX = "x-hetserve-"

_FIELDS = Fields(
    expected={"tried_models": "an array of strings", "weights": "an object of name -> number"},
    unknown={"": lambda p: bad(f"unknown field '{p}'; expected one of "
                                       + ", ".join(WORKFLOW_FIELDS), p)},
    tables={"weights": Weight})


def header_name(field_name: str) -> str:
    """``program_id`` -> ``X-Hetserve-Program-Id``."""
    return "X-Hetserve-" + "-".join(p.capitalize() for p in field_name.split("_"))


def _header_value(name: str, raw: str) -> Any:
    """A header string as the JSON value its workflow field expects (left as it is when
    it is not one: the struct reports the type)."""
    raw = raw.strip()
    if name in ("stage_index", "num_stages", "attempt"):
        try:
            return int(raw)
        except ValueError:
            return raw
    if name in ("budget", "expected_return_s"):
        try:
            return float(raw)
        except ValueError:
            return raw
    if name in ("final", "checked"):
        return {"true": True, "1": True, "yes": True,
                "false": False, "0": False, "no": False}.get(raw.lower(), raw)
    if name == "tried_models":
        return [m.strip() for m in raw.split(",") if m.strip()]
    if name == "objective":
        return objective_from_header(raw)
    if name == "weights":
        weights: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, val = item.partition("=")
            try:
                weights[key.strip()] = float(val) if sep else val
            except ValueError:
                weights[key.strip()] = val
        return weights
    return raw


def parse_workflow(body_value: Any, headers: Mapping[str, str]) -> dict[str, Any]:
    """The workflow fields given, from ``X-Hetserve-*`` headers overridden by the body's
    ``workflow`` object (an object or None: the body's struct checks that)."""
    merged: dict[str, Any] = {}
    params: dict[str, str] = {}
    given = {k.lower(): v for k, v in headers.items() if k.lower().startswith(HEADER_PREFIX)}
    for name in WORKFLOW_FIELDS:
        raw = given.pop(header_name(name).lower(), None)
        if raw is not None:
            merged[name], params[name] = _header_value(name, raw), header_name(name)
    unknown = sorted(given)
    if unknown:
        raise bad(f"unknown header '{unknown[0]}'; workflow headers are "
                  + ", ".join(header_name(n) for n in WORKFLOW_FIELDS), unknown[0])
    if not merged and not body_value:
        return {}
    if body_value:
        for key in body_value:
            params[key] = f"workflow.{key}"
        merged.update(body_value)

    def param(parts: list[str | int]) -> str:
        if not parts:
            return "workflow"
        return params.get(str(parts[0]), f"workflow.{parts[0]}") + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:])

    wf = convert(merged, Workflow, param, _FIELDS)
    out = {name: value for name in WORKFLOW_FIELDS
           if (value := getattr(wf, name)) is not UNSET}
    if "objective" in out:
        out["objective"] = _objective(out["objective"], params["objective"])
    index, stages = out.get("stage_index"), out.get("num_stages")
    if index is not None and stages is not None and index >= stages:
        raise bad(f"'workflow.stage_index' ({index}) must be < 'workflow.num_stages' "
                  f"({stages})", "workflow.stage_index")
    return out


def _objective(value: Any, param: str) -> Objective:
    try:
        return parse_objective(value, param)
    except ObjectiveError as exc:
        raise bad(exc.message, exc.param) from None
