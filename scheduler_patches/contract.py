"""The router-to-engine wire contract for request priorities, which the schedulers here
enforce (importable without vLLM).

A request's ``priority`` (body field, or the ``X-Vllm-Priority`` header, which wins) is
the router's predicted total remaining output tokens of the request's workflow:

- ``1 .. PRIORITY_MAX``: a prediction; lower is served first (Shortest-Total-Job-First).
- ``0`` (``NO_PRIORITY``, vLLM's default when the field is absent): no prediction. The
  STJF scheduler sorts it as ``unprioritized_priority`` (default ``PRIORITY_MAX``: after
  every predicted request, first-come-first-served among themselves; aging still applies).
- anything else (negative, above ``PRIORITY_MAX``, not an integer) is rejected with HTTP 400
  by the engine server before it reaches the engine.
"""

NO_PRIORITY = 0
PRIORITY_MIN = 0
PRIORITY_MAX = 2**31 - 1
PRIORITY_HEADER = "X-Vllm-Priority"
