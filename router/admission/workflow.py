"""The workflow block: a ``workflow`` object in the body (what OpenAI clients send through
``extra_body``) or ``X-Hetserve-*`` headers, decoded once as ``router.request.Workflow``; a
field given in both places takes the body's value. See ``docs/router.md`` for the field
table."""

from __future__ import annotations

from itertools import takewhile
from types import NoneType
from typing import Any, Callable, Mapping, Union, get_args, get_type_hints

import msgspec

from router.admission.convert import Fields, bad, convert, error
from router.request import RequestError, Weight, Workflow
from router.vinelm.objective import (Objective, ObjectiveError, objective_from_header,
                                     parse_objective)

WORKFLOW_FIELDS: tuple[str, ...] = Workflow.__struct_fields__
"""The workflow fields, in the order the messages list them."""

RANKING_FIELDS = ("workflow", "stage", "stage_index", "num_stages", "final",
                  "expected_return_s")
"""Workflow fields that rank a call (its predicted remaining tokens, hence its engine
priority: "final stage" buys a high one) or claim engine memory (a non-final stage and
its expected return keep the program's KV cache): used only from trusted callers
(``router.auth``); an untrusted caller's are dropped and the router predicts alone."""

HEADER_PREFIX = "x-hetserve-"

_ABSENT = object()
_NOT_NULL: dict[str, Any] = {
    name: Union[tuple(t for t in get_args(hint) if t is not NoneType)]
    for name, hint in get_type_hints(Workflow, include_extras=True).items()
    if NoneType in get_args(hint) and name != "objective"}
"""The type, without None, of each field whose default is None: a client's null there is
a 400, as any value of a wrong type (a null objective: ``parse_objective`` says so)."""

_FIELDS = Fields(
    expected={"tried_models": "an array of strings", "weights": "an object of name -> number"},
    unknown={"": lambda p: bad(f"unknown field '{p}'; expected one of "
                                       + ", ".join(WORKFLOW_FIELDS), p)},
    tables={"weights": Weight})


def header_name(field_name: str) -> str:
    """``program_id`` -> ``X-Hetserve-Program-Id``."""
    return "X-Hetserve-" + "-".join(p.capitalize() for p in field_name.split("_"))


_HEADERS = {name: header_name(name) for name in WORKFLOW_FIELDS}
"""Each workflow field's header, in the fields' order."""


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


def parse_workflow(body_value: Any, headers: Mapping[str, str]) -> Workflow:
    """The workflow of ``X-Hetserve-*`` headers overridden by the body's ``workflow``
    object (an object or None: the body's struct checks that). A null is not a value: it
    is a 400, as any value of the wrong type."""
    merged: dict[str, Any] = {}
    params: dict[str, str] = {}
    given = {low: v for k, v in headers.items()
             if (low := k.lower()).startswith(HEADER_PREFIX)}
    if given:
        for name, header in _HEADERS.items():
            raw = given.pop(header.lower(), None)
            if raw is not None:
                merged[name], params[name] = _header_value(name, raw), header
        unknown = sorted(given)
        if unknown:
            raise bad(f"unknown header '{unknown[0]}'; workflow headers are "
                      + ", ".join(_HEADERS.values()), unknown[0])
    if not merged and not body_value:
        return Workflow()
    if body_value:
        for key in body_value:
            params[key] = f"workflow.{key}"
        merged.update(body_value)

    def param(parts: list[str | int]) -> str:
        if not parts:
            return "workflow"
        return params.get(str(parts[0]), f"workflow.{parts[0]}") + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:])

    objective = merged.pop("objective", _ABSENT)
    null = next((k for k, v in merged.items() if v is None and k in _NOT_NULL), None)
    if null is not None:  # msgspec reports the first bad field in order: one before it first
        convert(dict(takewhile(lambda kv: kv[0] != null, merged.items())), Workflow, param,
                _FIELDS)
        raise _null(null, param)
    wf = convert(merged, Workflow, param, _FIELDS)
    if objective is not _ABSENT:
        wf = msgspec.structs.replace(wf, objective=_objective(objective, params["objective"]))
    index, stages = wf.stage_index, wf.num_stages
    if index is not None and stages is not None and index >= stages:
        raise bad(f"'workflow.stage_index' ({index}) must be < 'workflow.num_stages' "
                  f"({stages})", "workflow.stage_index")
    return wf


def _null(name: str, param: Callable[[list[str | int]], str]) -> RequestError:
    """The 400 of a null ``name``: what msgspec says of a null where its type takes none."""
    try:
        msgspec.convert(None, _NOT_NULL[name])
    except msgspec.ValidationError as exc:
        return error(f"{exc} - at `$.{name}`", {name: None}, param, _FIELDS)
    raise AssertionError(f"{name} takes null")


def _objective(value: Any, param: str) -> Objective:
    try:
        return parse_objective(value, param)
    except ObjectiveError as exc:
        raise bad(exc.message, exc.param) from None
