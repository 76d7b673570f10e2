"""KV retention between a program's calls (issue 32) as a mixin over vLLM's Scheduler.

A call whose retention hint (``scheduler_patches.contract``: program id, final or not,
expected return) says its program will return has its cached prefix blocks protected
from eviction when it ends (``scheduler_patches.protected``). They are released:

- when the program's next call is scheduled (it then holds the blocks it hit itself);
  the final call releases them the same way and protects nothing;
- at their deadline: ``min(retention_ttl_s, retention_slack * expected return)`` after
  the call ended, pushed to at least ``retention_ttl_s`` after the next call arrives;
  checked at the start of every ``schedule()``;
- to stay within ``max_protected_programs`` and ``max_protected_fraction``;
- under pressure (the free-block floor): when vLLM's ``allocate_slots`` would fail,
  for a running request or an admission, protected programs are released one by one,
  expected back last first, and the allocation retried. Retention therefore never
  refuses, delays or preempts a request: protected blocks are evicted after every
  unprotected one, not never.

Only calls that ended normally protect (not aborted or failed ones). Eviction order is
vLLM's own otherwise. Settings: ``RetentionSettings`` (``hetserve`` table).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request, RequestStatus

from scheduler_patches.contract import RetentionHint, retention_hint
from scheduler_patches.protected import ProtectedPrograms, RetentionSettings
from scheduler_patches.settings import from_table, hetserve_config

log = logging.getLogger(__name__)

_COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
              RequestStatus.FINISHED_REPETITION)
"""Ends after which a program may return to its prefix."""


def _releasing(allocate: Callable[..., Any], retention: ProtectedPrograms
               ) -> Callable[..., Any]:
    """``KVCacheManager.allocate_slots`` that, rather than fail, releases protected
    programs (expected back last first) and retries."""

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        blocks = allocate(*args, **kwargs)
        while blocks is None and retention.release_furthest("pressure"):
            blocks = allocate(*args, **kwargs)
        return blocks

    return allocate_slots


class RetentionPolicy:
    """Mixin over a vLLM ``Scheduler`` class: programs keep their KV cache between calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        manager = self.kv_cache_manager
        settings = from_table(RetentionSettings, hetserve_config(self.vllm_config))
        self.retention = ProtectedPrograms(settings, manager.block_pool,
                                           manager.block_pool.num_gpu_blocks - 1)
        self.retention_hints: dict[str, RetentionHint] = {}
        """Hints of the requests in the engine, by request id."""
        self.program_calls: dict[str, set[str]] = {}
        """The hinted requests in the engine, by program id."""
        self.malformed_hints = 0
        self.retaining = settings.enabled and manager.enable_caching
        if self.retaining:
            manager.allocate_slots = _releasing(manager.allocate_slots, self.retention)

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        if not self.retaining:
            return
        params = request.sampling_params
        try:
            hint = retention_hint(params.extra_args if params is not None else None)
        except ValueError as exc:
            self.malformed_hints += 1
            log.warning("request %s: retention hint ignored: %s", request.request_id, exc)
            return
        if hint is not None:
            self.retention_hints[request.request_id] = hint
            self.program_calls.setdefault(hint.program_id, set()).add(request.request_id)
            self.retention.returned(hint.program_id)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self.retention.expire()
        output = super().schedule(*args, **kwargs)
        for new in output.scheduled_new_reqs:
            hint = self.retention_hints.get(new.req_id)
            if hint is not None:
                self.retention.release(hint.program_id, "final" if hint.final else "returned")
        return output

    def _free_blocks(self, request: Request) -> Any:
        hint = self.retention_hints.pop(request.request_id, None)
        if hint is not None:
            calls = self.program_calls[hint.program_id]
            calls.discard(request.request_id)
            if not calls:
                del self.program_calls[hint.program_id]
        if hint is not None and not hint.final and request.status in _COMPLETED:
            blocks = [block for group in self.kv_cache_manager.get_blocks(
                request.request_id).blocks for block in group
                if block.block_hash is not None and not block.is_null]
            if blocks:
                self.retention.protect(hint.program_id, blocks, hint.expected_return_s)
        return super()._free_blocks(request)

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        self.retention.release_all("reset")
        return super().reset_prefix_cache(*args, **kwargs)
