"""Where ``python -m kernels_bench.lab.studies.fetch_real_models`` puts the real models it
fetches and converts."""

from __future__ import annotations

from pathlib import Path

from engine_ext.builtin_models import cache_root


def real_models_root() -> Path:
    """``$HETSERVE_CACHE/real-models`` (default ``~/.cache/hetserve/real-models``): one
    Hugging Face folder per model, named as the script names it."""
    return cache_root() / "real-models"
