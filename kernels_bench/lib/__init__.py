"""Shared helpers of several benchmarks: a model's ``config.json`` sizes (``model_config``) and
a vLLM scheduler with no model executor (``scheduler_harness``)."""
