"""Replay policy specs (the served -> trace model map: tests/unit/test_model_map.py)."""

from __future__ import annotations

import pytest

from kernels_bench.lab.replay.spec import PolicySpec, SpecError, parse_policies, parse_policy

ROUTERS = ["chimera", "vllm", "lmetric", "round_robin"]
SCHEDS = ["stjf", "fcfs", "priority", "mlfq"]


@pytest.mark.parametrize("text, want", [
    ("chimera:stjf", PolicySpec("chimera:stjf", "chimera", "stjf")),
    ("vllm:fcfs", PolicySpec("vllm:fcfs", "vllm", "fcfs")),
    ("lmetric", PolicySpec("lmetric", "lmetric", None)),
    ("oracle", PolicySpec("oracle", "chimera", "stjf", oracle=True)),
    ("oracle:mlfq", PolicySpec("oracle:mlfq", "chimera", "mlfq", oracle=True)),
    ("round_robin:stjf+oracle", PolicySpec("round_robin:stjf+oracle", "round_robin", "stjf",
                                           oracle=True)),
])
def test_parse_policy(text: str, want: PolicySpec) -> None:
    assert parse_policy(text, ROUTERS, SCHEDS) == want


@pytest.mark.parametrize("text, fragment", [
    ("chimra", "unknown router policy 'chimra'"),
    ("chimera:sjf", "unknown engine scheduler 'sjf'"),
    ("chimera+magic", "only suffix"),
    ("oracle+oracle", "already implies"),
    ("chimera:", "unknown engine scheduler ''"),
])
def test_parse_policy_errors(text: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_policy(text, ROUTERS, SCHEDS)


def test_duplicate_policy_rejected() -> None:
    with pytest.raises(SpecError, match="given twice"):
        parse_policies(["vllm:fcfs", "vllm:fcfs"], ROUTERS, SCHEDS)


def test_spec_settings_override_the_files() -> None:
    spec = parse_policies(["chimera-static:stjf@tau=0.5, delta_s=0.1,sticky=false"],
                          ROUTERS, SCHEDS)[0]
    assert (spec.router, spec.sched, spec.static) == ("chimera", "stjf", True)
    assert spec.overrides == (("tau", 0.5), ("delta_s", 0.1), ("sticky", False))
    for bad, fragment in (("chimera@tau", "not KEY=VALUE"), ("chimera@tau=x y", "TOML"),
                          ("chimera@tau=1,tau=2", "given twice"),
                          ("chimera@nope.win_factor=3", "names no router policy 'nope'")):
        with pytest.raises(SpecError, match=fragment):
            parse_policies([bad], ROUTERS, SCHEDS)
