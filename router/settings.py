"""One typed decoder for every settings table: the cluster file's and each policy's.

A settings class is a pydantic dataclass with ``config=STRICT`` (TOML types kept, an integer
taken for a number; unknown keys, NaN, infinity and strings over ``MAX_TEXT`` refused), its
bounds on the fields, its checks across fields in ``__post_init__`` (a policy's) or
``verify`` (a ``Verified`` class), both with ``check``. ``decode`` reports the first problem
as ``SettingsError``: ``<key path>: <what is wrong>``; ``encode`` is the way back.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Collection, Mapping, TypeVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

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
"""Longest name: what router workers' messages carry (``router.dispatch.peers``)."""
MAX_WORKERS = 256
"""Most router processes of one ``[router]`` (bounds a worker index in their messages)."""

Name = Annotated[str, Field(pattern=NAME_PATTERN.pattern, max_length=MAX_NAME_CHARS)]
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
        """Raise ``SettingsError`` (``check``, key relative to the table) on a broken rule."""


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


_ORDER = ("unexpected_keyword_argument", "missing", "value_error")
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
           "less_than": "<"}
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
             "bool_type": "true or false", "list_type": "a list", "dict_type": "a table"}
"""What a pydantic type error expected, in the file's words."""


def _translate(cls: type, table: Mapping[str, Any], path: str,
               errors: list[Any]) -> SettingsError:
    """The error to report: an unknown key, else a missing one, else a value (a bound
    broken before a type mismatch, since in a union the member of the value's own type
    says what is wrong; the mismatch deepest in the value, its union members together)."""
    found = [(e, *_locate(table, e)) for e in errors]
    e, parts, value = min(found, key=lambda f: (_ORDER.index(f[0]["type"]) if f[0]["type"]
                                                in _ORDER else len(_ORDER) +
                                                f[0]["type"].endswith("_type"), -len(f[1])))
    kind, ctx, key = e["type"], e.get("ctx", {}), _join(path, parts)
    if kind == "value_error":  # a check of __post_init__ or a constrained type's
        err = ctx.get("error")
        if isinstance(err, SettingsError):
            return SettingsError(f"{path}.{err.key}", err.problem)
        return SettingsError(key, str(err))
    if kind == "unexpected_keyword_argument":
        fields = cls.__pydantic_fields__  # type: ignore[attr-defined]
        known = [f.alias or name for name, f in fields.items()]
        return SettingsError(key, "unknown key" + (suggest(str(parts[-1]), known) or
                                                   "; known keys: " + (", ".join(known) or "none")))
    problems = {
        "missing": lambda: "missing",
        **dict.fromkeys(_BOUNDS, lambda: f"must be {_BOUNDS[kind]} "
                        f"{next(iter(ctx.values()))}, got {_shown(value)}"),
        "finite_number": lambda: f"must be finite, got {value!r}",
        "too_short": lambda: f"needs at least {ctx['min_length']} entries, got {len(value)}",
        "string_too_long": lambda: f"must be at most {ctx['max_length']} characters, got "
                                   f"{len(value)}",
        "string_pattern_mismatch": lambda: f"must match {ctx['pattern']!r}, got "
                                           f"{_shown(value)}"}
    if kind in problems:
        return SettingsError(key, problems[kind]())
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", ctx["expected"])
        if not isinstance(value, str):
            return SettingsError(key, f"expected one of {', '.join(map(repr, choices))}, "
                                 f"got {describe_value(value)}")
        return SettingsError(key, f"unknown value {value[:40]!r}{suggest(value, choices)}; "
                             "one of " + ", ".join(choices))
    if kind.endswith("_type"):
        expected = dict.fromkeys(_EXPECTED.get(f[0]["type"], f[0]["type"]) for f in found
                                 if f[1] == parts and f[0]["type"].endswith("_type"))
        return SettingsError(key, f"expected {' or '.join(expected)}, got "
                             f"{describe_value(value)}")
    return SettingsError(key, str(e["msg"]))


def _locate(table: Any, error: Any) -> tuple[list[Any], Any]:
    """The keys of the table an error's ``loc`` names (pydantic's tags for the union
    member it tried skipped) and the value there."""
    parts: list[Any] = []
    value, loc = table, error["loc"]
    for i, part in enumerate(loc):
        if isinstance(value, (dict, list)) and (
                part in value if isinstance(value, dict) else
                isinstance(part, int) and 0 <= part < len(value)):
            parts.append(part)
            value = value[part]
        elif error["type"] == "missing" and i == len(loc) - 1:
            parts.append(part)
    return parts, value


def _join(path: str, parts: Any) -> str:
    out = path
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
