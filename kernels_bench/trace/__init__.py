"""Workflow traces: the data the router's predictors learn from and the replay runs on.

``load_trace(path)`` reads and validates a trace (see docs/traces.md and ``format``);
``python -m kernels_bench trace ...`` builds, converts, checks and describes traces.
"""

from kernels_bench.trace.format import (
    ModelRun,
    Stage,
    Trace,
    TraceFormatError,
    WorkflowRun,
    load_trace,
)

__all__ = ["ModelRun", "Stage", "Trace", "TraceFormatError", "WorkflowRun", "load_trace"]
