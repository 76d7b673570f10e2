"""Serving replay: compare policies by replaying workflow traces through a real cluster
(``python -m kernels_bench replay``; docs/research/replay.md)."""
