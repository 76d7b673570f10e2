"""Every test here tests the lab (``kernels_bench.lab``), not the product: marked ``lab``,
so ``pytest -m "not lab"`` runs the product's tests alone."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of this folder ``lab`` (the hook sees every collected item)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.lab)
