"""The launcher's backend seam: what carrying a plan out on some machines means.

A backend plans its engines (their ports and devices, or what they ask of a cluster),
starts a process and hands back its ``launcher.process.ProcessHandle``, says whether a
plan fits (``--dry-run``), and releases all it holds. The supervisor and the run loop
see only this interface and the handles (as vLLM's ``Executor.get_class()``: chosen
once, never branched on after).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from launcher.devices import Devices
from launcher.plan import Plan, PortPlan, ProcessPlan
from launcher.ports import PortFree
from launcher.process import ProcessHandle, ProcessSpec
from launcher.settings import EngineCluster, LaunchConfig
from router.config.engines import EngineConfig


class Backend(abc.ABC):
    """Runs a plan's engines; the router always runs on the launcher's machine."""

    scales: ClassVar[bool] = False
    """Whether a running launcher can change replica counts (``--scale``)."""

    # ---- planning (pure: no machine is contacted)

    @classmethod
    def check_only(cls, only: Sequence[str]) -> None:
        """LaunchError if this backend cannot start just the entries ``only`` names
        (``--only``)."""

    @classmethod
    @abc.abstractmethod
    def resolve_engines(cls, cfg: LaunchConfig, run_dir: Path, ports: PortPlan
                        ) -> list[EngineConfig]:
        """The engine entries with what the launcher sets before start (ports,
        endpoints)."""

    @classmethod
    @abc.abstractmethod
    def plan_engines(cls, cfg: LaunchConfig, run_dir: Path, python: str,
                     devices: Devices | None, telemetry_host: str | None,
                     port_free: PortFree, warnings: list[str]) -> list[ProcessPlan]:
        """One process per engine replica of the resolved ``cfg`` (remote entries
        aside); ``warnings`` gets what the user should know."""

    @classmethod
    @abc.abstractmethod
    def describe(cls, cfg: LaunchConfig, devices: Devices | None) -> str:
        """Where engines run, as ``--dry-run`` shows it."""

    # ---- running

    @classmethod
    @abc.abstractmethod
    def connect(cls, cluster: EngineCluster, run_dir: Path) -> Backend:
        """This backend for the cluster ``[cluster]`` names, its processes marked with
        ``run_dir`` (LaunchError: it cannot be reached)."""

    @property
    def telemetry_host(self) -> str | None:
        """Where engines placed elsewhere reach the router's telemetry (None: here)."""
        return None

    @abc.abstractmethod
    def start(self, spec: ProcessSpec, restarts: int = 0) -> ProcessHandle:
        """Start ``spec`` (its ``restarts``-th restart); LaunchError or OSError: it did
        not start."""

    @abc.abstractmethod
    def fit(self, placements: Sequence[tuple[str, Any]]) -> list[str]:
        """Dry run: where engines (each a name and its spec's ``placement``) would go
        now, a line each; none where the plan itself decides it."""

    def placed(self, plan: Plan, handles: Mapping[str, ProcessHandle]) -> Plan:
        """The plan as the router loads it once engines run (``handles``: each running
        engine by name); by default, as planned."""
        return plan

    def replan(self, plan: Plan, name: str) -> tuple[Plan, str] | None:
        """Before engine ``name`` restarts: the plan with it moved and what changed;
        None to restart it as planned."""
        return None

    def close(self) -> None:
        """Release everything this backend created."""
