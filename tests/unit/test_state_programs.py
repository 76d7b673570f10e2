"""Program table (Chimera's activity monitor): assignment, release, TTL expiry."""

from __future__ import annotations

import asyncio

import pytest

from router.dispatch.core import RouterCore
from router.state.programs import ProgramTable
from router.request import Workflow
from router.types import Decision, RoutingRequest
from tests.unit.test_state_engines import make_core, view


def stage(core: RouterCore, rid: str, index: int, stages: int = 3,
          program: str = "p") -> Decision:
    return asyncio.run(core.routing.route(RoutingRequest(
        request_id=rid, requested_model=None, num_prompt_tokens=10, max_tokens=10,
        workflow=Workflow(program_id=program, stage_index=index, num_stages=stages))))


def test_table_assign_complete_expire() -> None:
    t = ProgramTable(ttl_s=10)
    t.routed("p", "a", now=0)
    assert t.model("p") == "a" and t.model(None) is None
    t.completed("p", final=False, error=False, now=5)
    t.completed("p", final=True, error=True, now=6)  # a failed final stage keeps it
    assert t.expire(now=16) == [] and "p" in t
    assert t.expire(now=16.5) == ["p"] and t.model("p") is None
    t.routed("q", "b", now=20)
    t.completed("q", final=True, error=False, now=21)
    assert "q" not in t
    with pytest.raises(ValueError, match="program_ttl_s must be > 0"):
        ProgramTable(ttl_s=0)


def test_core_keeps_program_until_final_stage_completes() -> None:
    core, _ = make_core()
    d0 = stage(core, "s0", 0)
    assert core.state.programs.model("p") == "a" and not d0.final
    core.routing.on_complete(d0, 12, None)
    assert "p" in core.state.programs and len(core.state.ledger) == 0
    d2 = stage(core, "s2", 2)
    assert d2.final
    core.routing.on_complete(d2, 7, None)
    assert "p" not in core.state.programs


def test_error_releases_inflight_but_keeps_program_until_ttl() -> None:
    core, clock = make_core(program_ttl_s=30.0)
    d = stage(core, "s2", 2)
    assert view(core, d.instance).inflight_requests == 1
    core.routing.on_complete(d, None, "client disconnected")
    assert view(core, d.instance).inflight_requests == 0 and "p" in core.state.programs
    clock.t += 30.5
    core.membership.engines()  # maintenance runs on the request and metrics paths
    assert "p" not in core.state.programs and core.membership.stats.programs_expired == 1


def test_activity_keeps_a_program_alive() -> None:
    core, clock = make_core(program_ttl_s=30.0)
    stage(core, "s0", 0)
    clock.t += 20
    stage(core, "s1", 1)
    clock.t += 20
    core.membership.engines()
    assert "p" in core.state.programs
