"""Settings of the whole test session, applied before any test module is imported, and the
engines shared by every module that routes to them."""

import os
from collections.abc import Iterator

import pytest

from tests.tiny_pair import TinyPair, new_pair

# Ray clusters the tests make live on one machine, on loopback: Ray must not swap
# 127.0.0.1 for the host's address (read once, when Ray is first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def tiny_pair() -> Iterator[TinyPair]:
    """The two engines of tests/tiny_pair.py, started once for the session (integration and
    lab modules alike); each module's own fixture calls ``revive`` first (an engine an
    earlier module killed starts again)."""
    pair = new_pair()
    try:
        yield pair
    finally:
        pair.stop()
