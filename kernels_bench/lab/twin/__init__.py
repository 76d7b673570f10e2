"""The digital twin of a cluster (issue 15): vLLM's real schedulers on a virtual clock.

``engine``: one engine instance (real scheduler and KV cache manager, modelled step time;
hetserve's engine or a stock vLLM server);
``engine_spec``: its sizes from a cluster file; ``step_time``: the step-time model from an
engine profile; ``roofline``: modelled GPU profiles in the same format; ``floor``: GPU
profiles from a measured floor plus a stated overhead; ``telemetry``: its
snapshots and KV events as wire frames; ``sim``: the discrete-event core; ``request``:
requests and their timestamps. docs/research/twin.md.
"""
