"""Fixtures shared by the integration modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tiny_pair import TinyPair, new_pair


@pytest.fixture(scope="package")
def tiny_pair() -> Iterator[TinyPair]:
    """The two engines of tests/tiny_pair.py, started once for the package; each module's
    own fixture calls ``revive`` first (an engine an earlier module killed starts again)."""
    pair = new_pair()
    try:
        yield pair
    finally:
        pair.stop()
