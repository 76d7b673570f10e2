"""Workflow traces: the data the router's predictors learn from and the replay runs on.

``python -m kernels_bench trace ...`` builds, converts, checks and describes traces. The
file format itself (``load_trace``, ``TraceWriter``; docs/research/traces.md) is
``router.trace_format``: the router's training reads it, so it sits in the router layer.
"""
