"""Policy parts by name: a registry's line per part is ``"name": "module:Class"``.

``load`` imports each part's module (relative to the registry's package) when the registry
is imported, and checks that the class derives the registry's base and carries the name it
is registered under, so a typo fails at import, not on a request.
"""

from __future__ import annotations

import importlib
from typing import Mapping, TypeVar

T = TypeVar("T", bound=type)


def load(package: str, base: T, lines: Mapping[str, str]) -> dict[str, T]:
    """``{name: class}`` from ``{name: "module:Class"}``, modules under ``package``."""
    parts: dict[str, T] = {}
    for name, ref in lines.items():
        module, _, attr = ref.partition(":")
        part = getattr(importlib.import_module(f"{package}.{module}"), attr)
        if not (isinstance(part, type) and issubclass(part, base)
                and getattr(part, "name", None) == name):
            raise TypeError(f"{package}.{ref} is not a {base.__name__} named {name!r}")
        parts[name] = part
    return parts
