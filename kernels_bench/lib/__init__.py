"""Shared helpers of several benchmarks: a model's ``config.json`` sizes (``model_config``), a
vLLM scheduler with no model executor (``scheduler_harness``), a cluster started through the
launcher (``cluster``), engine and router ``/metrics`` (``engine_metrics``), the served ->
trace model map (``model_map``) and static priors from a trace (``priors``)."""
