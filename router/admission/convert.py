"""``convert``: a decoded JSON value as a typed msgspec struct, or a 400 naming the field.

msgspec checks the types and the bounds declared on the structs (``router.admission.bodies``,
``router.admission.workflow``); its first error becomes a ``RequestError`` whose ``param`` is
the field's path (``messages[0].role``, ``workflow.weights.quality``) and whose message
says what the field takes and what it got. Total: any value gives the struct or a 400.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, TypeVar

import msgspec

from router.request import RequestError
from router.vinelm.objective import MAX_NUMBER

T = TypeVar("T")

EXPECTED = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean",
            "object": "an object", "array": "an array", "null": "null"}
"""msgspec's type names as the messages say them."""
GOT = {"int": "integer", "float": "number", "str": "string", "bool": "boolean",
       "object": "object", "array": "array", "null": "null"}

_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")
_TYPE = re.compile(r"^Expected `(?P<expected>[^`]*)`, got `(?P<got>[^`]*)`$")
_BOUND = re.compile(r"^Expected `(?P<type>int|float)` (?P<op>[<>]=?) (?P<bound>\S+)$")
_LENGTH = re.compile(r"^Expected `(?P<type>str|array)` of length (?P<op>[<>]=?) (?P<n>\d+)$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>.*)`$", re.S)
_NAME = re.compile(r"(?:^|\.)([A-Za-z_][\w-]*)$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>.*)`$", re.S)


class Fields:
    """What the messages say about particular fields, by field name (the path's last
    name): ``expected`` (what a field of that name takes, in words; ``name:type`` for
    one of the types msgspec expects there), ``required`` (the
    message of a missing one), ``unknown`` (object name -> the message of an unknown key
    in it, from the key's param) and ``tables`` (name -> the ``dict`` type of an object of
    name -> value: the type of its values, to name the failing key)."""

    def __init__(self, expected: Mapping[str, str] | None = None,
                 required: Mapping[str, str] | None = None,
                 unknown: Mapping[str, Callable[[str], RequestError]] | None = None,
                 tables: Mapping[str, Any] | None = None) -> None:
        self.expected = expected or {}
        self.required = required or {}
        self.unknown = unknown or {}
        self.tables = tables or {}


def convert(value: Any, type_: type[T], param: Callable[[list[str | int]], str],
            fields: Fields) -> T:
    """``value`` as ``type_`` (strict: no string for a number, no boolean for an integer);
    RequestError 400 naming the field, whose param ``param`` makes from the path."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        raise error(str(exc), value, param, fields) from None


def error(text: str, value: Any, param: Callable[[list[str | int]], str],
          fields: Fields) -> RequestError:
    """The RequestError of msgspec's error ``text`` on ``value``."""
    m = _ERROR.match(text)
    what, path = (m.group("what"), m.group("path") or "") if m else (text, "")
    parts: list[str | int] = []
    for name, index in _SEGMENT.findall(path):
        parts.append(name or (int(index) if index != "..." else "..."))
    if "..." in parts:  # a value of an object of name -> value: find the failing name
        cut = parts.index("...")
        table = _at(value, parts[:cut])
        item_type = fields.tables.get(_last_name(parts[:cut]))
        if isinstance(table, dict) and item_type is not None:
            for key, item in table.items():
                try:
                    msgspec.convert(item, item_type)
                except msgspec.ValidationError as inner:
                    return error(str(inner), item,
                                 lambda p, k=key: param([*parts[:cut], k, *p]), fields)
        parts = parts[:cut]
    return _message(what, parts, _at(value, parts), param, fields)


def _message(what: str, parts: list[str | int], value: Any,
             param: Callable[[list[str | int]], str], fields: Fields) -> RequestError:
    if (m := _MISSING.match(what)) is not None:
        p = param([*parts, m.group("name")])
        text = fields.required.get(m.group("name"), f"'{p}' is required")
        return bad(text, p, "missing_field")
    if (m := _UNKNOWN.match(what)) is not None:
        p = param([*parts, m.group("name")])
        unknown = fields.unknown.get(parts[-1] if parts and isinstance(parts[-1], str) else "")
        return unknown(p) if unknown is not None else bad(f"unknown field '{p}'", p)
    p = param(parts)
    name = m.group(1) if (m := _NAME.search(p)) is not None else ""
    if (m := _TYPE.match(what)) is not None:
        expected = fields.expected.get(f"{name}:{m.group('expected')}") or \
            fields.expected.get(name) or " or ".join(
            EXPECTED.get(t, t) for t in m.group("expected").split(" | ") if t != "null")
        got = GOT.get(m.group("got"), m.group("got"))
        return bad(f"'{p}' must be {expected}, got {got}", p, "invalid_type")
    if (m := _BOUND.match(what)) is not None or what == "Number out of range":
        return _bound(p, m, value)
    if (m := _LENGTH.match(what)) is not None:
        if m.group("op").startswith(">"):
            if fields.expected.get(name) == "a non-empty array":
                return bad(f"'{p}' must be a non-empty array, got an empty array", p)
            return bad(f"'{p}' must not be empty", p)
        if m.group("type") == "str" and name in fields.expected:
            return bad(f"'{p}' must be {fields.expected[name]}, got string", p, "invalid_type")
        n = len(value) if isinstance(value, (str, list)) else "more"
        return bad(f"'{p}' must be at most {m.group('n')} characters, got {n}", p)
    return bad(f"'{p}' is not valid: {what[:200]}", p or None)


def _bound(p: str, m: re.Match[str] | None, value: Any) -> RequestError:
    """A number out of its bounds (``Number out of range``: beyond a double's)."""
    if m is None:  # every number field takes 0.0 to MAX_NUMBER
        low = isinstance(value, (int, float)) and value < 0
        return bad(f"'{p}' must be a finite number {'>= 0.0' if low else f'<= {MAX_NUMBER:g}'}"
                   f", got {shown(value)}", p)
    bound: Any = m.group("bound")
    if m.group("type") == "float":
        bound = float(bound)
        bound = f"{bound}" if m.group("op").startswith(">") else f"{bound:g}"
        return bad(f"'{p}' must be a finite number {m.group('op')} {bound}, got "
                   f"{shown(value)}", p)
    return bad(f"'{p}' must be {m.group('op')} {bound}, got {shown(value)}", p)


def bad(message: str, param: str | None, code: str = "invalid_value") -> RequestError:
    """A 400 about ``param``."""
    return RequestError(400, message, param=param, code=code)


def shown(value: Any) -> str:
    """A number for an error message (a huge integer by its digit count)."""
    text = str(value)
    return text if len(text) <= 40 else f"an integer of {len(text)} digits"


def type_name(value: Any) -> str:
    """A JSON value's type, as the messages say it."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _at(value: Any, parts: list[str | int]) -> Any:
    """The value at ``parts`` inside ``value`` (None where there is none)."""
    for part in parts:
        if isinstance(value, dict) and isinstance(part, str):
            value = value.get(part)
        elif isinstance(value, list) and isinstance(part, int) and part < len(value):
            value = value[part]
        else:
            return None
    return value


def _last_name(parts: list[str | int]) -> str:
    return next((p for p in reversed(parts) if isinstance(p, str)), "")


def dotted(parts: list[str | int]) -> str:
    """``["messages", 0, "role"]`` -> ``messages[0].role``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
