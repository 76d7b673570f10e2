"""Where engines run: one backend per ``[cluster] backend``, chosen once by name.

``backend_class`` picks the class (``local``: this machine's GPUs or CPU cores;
``ray``: placement groups on a Ray cluster), importing only that backend's module;
nothing after it branches on the choice (``launcher.backends.base``).
"""

from __future__ import annotations

import importlib

from launcher.backends.base import Backend

_MODULES = {"local": "launcher.backends.local", "ray": "launcher.backends.ray"}


def backend_class(name: str) -> type[Backend]:
    """The backend ``[cluster] backend = name`` runs engines on."""
    cls: type[Backend] = importlib.import_module(_MODULES[name]).BACKEND
    return cls
