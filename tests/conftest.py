"""Settings of the whole test session, applied before any test module is imported."""

import os

# Ray clusters the tests make live on one machine, on loopback: Ray must not swap
# 127.0.0.1 for the host's address (read once, when Ray is first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
