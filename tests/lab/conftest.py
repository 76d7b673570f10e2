"""Every test here tests the lab (``kernels_bench.lab``), not the product: marked ``lab``,
so ``pytest -m "not lab"`` runs the product's tests alone."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of this folder ``lab``."""
    here = __file__.rsplit("/", 1)[0] + "/"
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.lab)
