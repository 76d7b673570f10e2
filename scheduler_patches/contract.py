"""The router-to-engine wire contract, which the schedulers here enforce (importable
without vLLM): request priorities and the KV retention hint.

**Priority.** A request's ``priority`` (body field, or the ``X-Vllm-Priority`` header,
which wins) is the router's predicted total remaining output tokens of the request's
workflow:

- ``1 .. PRIORITY_MAX``: a prediction; lower is served first (Shortest-Total-Job-First).
- ``0`` (``NO_PRIORITY``, vLLM's default when the field is absent): no prediction. The
  STJF scheduler sorts it as ``unprioritized_priority`` (default ``PRIORITY_MAX``: after
  every predicted request, first-come-first-served among themselves; aging still applies).
- anything else (negative, above ``PRIORITY_MAX``, not an integer) is rejected with HTTP 400
  by the engine server before it reaches the engine.

**Retention hint.** Carried in vLLM's ``vllm_xargs`` body object (completions and chat),
which vLLM hands to the engine core as ``Request.sampling_params.extra_args``; the
scheduler reads it there (``scheduler_patches.retention``). Three flat keys (vLLM takes
only strings, numbers and lists there, and turns JSON booleans into 0/1):

- ``hetserve_program_id`` (``RETAIN_PROGRAM``): the calling program, 1 to
  ``MAX_PROGRAM_ID_CHARS`` characters. Required when either other key is given.
- ``hetserve_final`` (``RETAIN_FINAL``): 1 if this is the program's last call (nothing to
  keep afterwards), 0 if it will return. Default 0.
- ``hetserve_expected_return_s`` (``RETAIN_RETURN``): seconds from this call's end to the
  program's next call, a finite number in ``[0, MAX_EXPECTED_RETURN_S]``; optional.

A request whose hint is malformed is rejected with HTTP 400 by the engine server; the
scheduler ignores a malformed hint that reaches it some other way (offline ``LLM`` use).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NO_PRIORITY = 0
PRIORITY_MIN = 0
PRIORITY_MAX = 2**31 - 1
PRIORITY_HEADER = "X-Vllm-Priority"

RETAIN_PROGRAM = "hetserve_program_id"
RETAIN_FINAL = "hetserve_final"
RETAIN_RETURN = "hetserve_expected_return_s"
RETAIN_KEYS = (RETAIN_PROGRAM, RETAIN_FINAL, RETAIN_RETURN)
RETAIN_PREFIX = "hetserve_"
"""Keys of ``vllm_xargs`` that only the router sets (it drops a client's)."""
XARGS_FIELD = "vllm_xargs"
MAX_PROGRAM_ID_CHARS = 1024
MAX_EXPECTED_RETURN_S = 86_400.0


@dataclass(frozen=True)
class RetentionHint:
    """What a call says about its program's return."""

    program_id: str
    final: bool = False
    expected_return_s: float | None = None

    def xargs(self) -> dict[str, str | int | float]:
        """The ``vllm_xargs`` entries that carry this hint."""
        out: dict[str, str | int | float] = {RETAIN_PROGRAM: self.program_id,
                                             RETAIN_FINAL: int(self.final)}
        if self.expected_return_s is not None:
            out[RETAIN_RETURN] = self.expected_return_s
        return out


def retention_hint(xargs: Mapping[str, Any] | None) -> RetentionHint | None:
    """The hint in a request's ``vllm_xargs`` / ``extra_args``, None if it carries none;
    ValueError naming the key when it is malformed."""
    if not xargs or not any(k in xargs for k in RETAIN_KEYS):
        return None
    program = xargs.get(RETAIN_PROGRAM)
    if not isinstance(program, str) or not 1 <= len(program) <= MAX_PROGRAM_ID_CHARS:
        raise ValueError(f"{XARGS_FIELD}.{RETAIN_PROGRAM} must be a string of 1 to "
                         f"{MAX_PROGRAM_ID_CHARS} characters, got {program!r:.80}")
    final = xargs.get(RETAIN_FINAL, 0)
    if final not in (0, 1) or isinstance(final, float):
        raise ValueError(f"{XARGS_FIELD}.{RETAIN_FINAL} must be 0 or 1, got {final!r:.80}")
    back = xargs.get(RETAIN_RETURN)
    if back is not None and (isinstance(back, bool) or not isinstance(back, (int, float))
                             or not math.isfinite(back)
                             or not 0 <= back <= MAX_EXPECTED_RETURN_S):
        raise ValueError(f"{XARGS_FIELD}.{RETAIN_RETURN} must be a number in "
                         f"[0, {MAX_EXPECTED_RETURN_S:g}], got {back!r:.80}")
    return RetentionHint(program, bool(final), None if back is None else float(back))
