"""One typed decoder for every settings table: the cluster file's and each policy's.

A settings class is a pydantic dataclass with ``config=STRICT``: values keep their TOML
type (no string for a number, no boolean for an integer; an integer is taken for a
number), unknown keys are rejected, NaN and infinity are rejected, every string is at
most ``MAX_TEXT`` characters, and bounds are declared on the fields (the aliases below,
or ``Field(ge=...)``). Checks across fields stay in the class: a policy's in
``__post_init__``, a cluster-file table's in ``verify`` (a ``Verified`` class), both with
``check``. ``decode`` builds one from a table and turns the first problem into a
``SettingsError`` whose message is ``<key path>: <what is wrong>``; ``encode`` is the way
back.
"""

from __future__ import annotations

import difflib
import re
import types
from typing import (Annotated, Any, Collection, Literal, Mapping, TypeVar, Union, get_args,
                    get_origin)

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError

MAX_TEXT = 4096
"""Longest string any setting takes (paths, URLs, names)."""
MAX_COUNT = 2**53
"""Largest integer any setting takes (exact as a float)."""

STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False,
                    str_max_length=MAX_TEXT)

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Port = Annotated[int, Field(ge=1, le=65535)]
Niceness = Annotated[int, Field(ge=0, le=19)]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""What a name (of an engine, a Ray namespace) may be."""


MAX_NAME_CHARS = 256
"""Longest name: what router workers' messages to each other carry
(``router.dispatch.peers``)."""
MAX_WORKERS = 256
"""Most router processes one ``[router]`` may ask for (a worker index in their messages
to each other is below it)."""


def _name(value: str) -> str:
    if NAME_PATTERN.match(value) is None:
        raise ValueError(f"{value[:80]!r}: use letters, digits, '_', '.' and '-', starting "
                         "with a letter or digit")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{value[:80]!r}...: at most {MAX_NAME_CHARS} characters")
    return value


Name = Annotated[str, AfterValidator(_name)]
"""A name (``NAME_PATTERN``): an engine's, a Ray namespace."""

T = TypeVar("T")


class SettingsError(ValueError):
    """A bad settings value; ``str()`` is ``<key path>: <problem>``."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


class Verified:
    """Base of a settings class with rules across its fields, in ``verify``: ``decode``
    calls it once every field is valid (``dataclasses.replace`` does not)."""

    def verify(self) -> None:
        """Raise ``SettingsError`` (``check``) on a broken rule, its key relative to the
        table."""


def check(key: str, ok: bool, problem: str) -> None:
    """A cross-field check of a settings class (``key`` relative to its table)."""
    if not ok:
        raise SettingsError(key, problem)


def decode(cls: type[T], table: Any, path: str) -> T:
    """``cls`` from ``table`` (the table at key path ``path``); ``SettingsError`` naming
    the key on the first problem."""
    if not isinstance(table, Mapping):
        raise SettingsError(path, f"expected a table, got {describe_value(table)}")
    try:
        obj = cls(**table)
    except ValidationError as exc:
        raise _translate(cls, table, path, exc.errors()) from None
    except RecursionError:
        raise SettingsError(path, "nested too deeply") from None
    if isinstance(obj, Verified):
        try:
            obj.verify()
        except SettingsError as e:
            raise SettingsError(_join(path, [e.key]), e.problem) from None
    return obj


def encode(obj: Any) -> dict[str, Any]:
    """The table of settings ``obj``: its keys whose values differ from their defaults."""
    return TypeAdapter(type(obj)).dump_python(obj, exclude_defaults=True)


def suggest(word: str, choices: Collection[str], prefix: str = "") -> str:
    """`` (did you mean 'x'?)`` for a close match of ``word``, else nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""


def describe_value(value: Any) -> str:
    """``a string ('x')``: the kind of a TOML value and its start."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}
    return f"{kinds.get(type(value), type(value).__name__)} ({_shown(value)})"


def _shown(value: Any) -> str:
    """At most 40 characters of ``value``'s repr (a list or table by its length)."""
    if isinstance(value, (list, dict)):
        return f"of {len(value)}"
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"{'-' if value < 0 else ''}{len(str(abs(value)))} digits"
    shown = repr(value[:40] if isinstance(value, str) else value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def describe_type(tp: Any) -> str:
    """``an integer or a list of integers``: what a field takes, in words."""
    tp, origin = _strip(tp), get_origin(_strip(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in get_args(tp) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin is list:
        return f"a list of {_plural(get_args(tp)[0])}"
    if origin is dict:
        inner = _strip(get_args(tp)[1])
        return "a table" if inner is Any or get_origin(inner) is dict else \
            f"a table of {_plural(inner)}"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            Any: "any value"}.get(tp, str(tp))


def _plural(tp: Any) -> str:
    return describe_type(tp).split(" ", 1)[1] + "s"


def _strip(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


_ORDER = ("unexpected_keyword_argument", "missing", "value_error")
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
           "less_than": "<"}


def _translate(cls: type, table: Mapping[str, Any], path: str,
               errors: list[Any]) -> SettingsError:
    """The error to report: an unknown key, else a missing one, else a value (a bound
    broken before a type mismatch, since in a union the member of the value's own type
    says what is wrong)."""
    def rank(e: Any) -> int:
        return _ORDER.index(e["type"]) if e["type"] in _ORDER else \
            len(_ORDER) + e["type"].endswith("_type")

    e = min(errors, key=rank)
    kind, loc = e["type"], e["loc"]
    fields = cls.__pydantic_fields__  # type: ignore[attr-defined]
    if kind == "value_error":  # a check of __post_init__ or a constrained type's
        err = e.get("ctx", {}).get("error")
        if isinstance(err, SettingsError):
            return SettingsError(f"{path}.{err.key}", err.problem)
        return SettingsError(_join(path, _locate(fields, loc)[0] if loc else []), str(err))
    if kind == "unexpected_keyword_argument":
        known = [f.alias or name for name, f in fields.items()]
        hint = suggest(str(loc[0]), known)
        return SettingsError(_join(path, loc), "unknown key" + (
            hint or "; known keys: " + (", ".join(known) or "none")))
    if kind == "missing":
        return SettingsError(_join(path, loc), "missing")
    parts, tp = _locate(fields, loc)
    value: Any = table
    for part in parts:
        value = value[part]
    key = _join(path, parts)
    if kind in _BOUNDS:
        bound = next(iter(e["ctx"].values()))
        return SettingsError(key, f"must be {_BOUNDS[kind]} {bound}, got {_shown(value)}")
    if kind == "finite_number":
        return SettingsError(key, f"must be finite, got {value!r}")
    if kind == "too_short":
        return SettingsError(key, f"needs at least {e['ctx']['min_length']} entries, "
                             f"got {len(value)}")
    if kind == "string_too_long":
        return SettingsError(key, f"must be at most {e['ctx']['max_length']} characters, "
                             f"got {len(value)}")
    if kind == "literal_error" and isinstance(value, str):
        choices = [str(a) for a in get_args(_strip(tp))]
        return SettingsError(key, f"unknown value {value[:40]!r}{suggest(value, choices)}; "
                             "one of " + ", ".join(choices))
    if kind.endswith("_type") or kind == "literal_error":
        return SettingsError(key, f"expected {describe_type(tp)}, "
                             f"got {describe_value(value)}")
    return SettingsError(key, str(e["msg"]))


def _locate(fields: Mapping[str, Any], loc: tuple[Any, ...]) -> tuple[list[Any], Any]:
    """The part of ``loc`` that names keys of the table (pydantic adds a tag for the
    union member it tried: the error belongs to the union), and the type there."""
    by_key = {f.alias or name: f for name, f in fields.items()}
    field = by_key[loc[0]]
    parts: list[Any] = [loc[0]]
    tp: Any = field.annotation
    for part in loc[1:]:
        inner = _strip(tp)
        if get_origin(inner) in (Union, types.UnionType):
            members = [a for a in get_args(inner) if a is not type(None)]
            if len(members) > 1:
                break
            inner = _strip(members[0])
        args = get_args(inner)
        tp = args[-1] if get_origin(inner) in (dict, list) else inner
        parts.append(part)
    members = [a for a in get_args(_strip(tp)) if a is not type(None)]
    optional = get_origin(_strip(tp)) in (Union, types.UnionType) and len(members) == 1
    return parts, members[0] if optional else tp


def _join(path: str, parts: Any) -> str:
    out = path
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
