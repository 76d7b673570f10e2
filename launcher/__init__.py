"""``python -m launcher cluster.toml``: plan, start and supervise a hetserve cluster."""


class LaunchError(Exception):
    """A problem the launcher reports in one line before it exits non-zero."""
