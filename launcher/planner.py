"""``make_plan``: the launch plan of a cluster file, its engines planned by the backend
``[cluster] backend`` names (``launcher.backends``).

Pure apart from probing which ports are free (injectable): the router's ports, then the
backend's engine ports and endpoints, are filled in and the result re-validated exactly
as the router will load it; then each engine replica and router process gets its
command line and environment (``launcher.plan``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from launcher.backends import backend_class
from launcher.devices import Devices
from launcher.plan import Plan, PortPlan, resolve_router, router_processes, select
from launcher.ports import PortFree, port_is_free
from launcher.settings import LaunchConfig, parse_launch_config


def make_plan(cfg: LaunchConfig, devices: Devices | None, run_dir: Path,
              only: Sequence[str] = (), port_free: PortFree | None = None,
              python: str = sys.executable, ray_host: str | None = None) -> Plan:
    """Plan the cluster of ``cfg`` in ``run_dir`` (absolute); with ``only``, just those
    engines and no router (for a host that runs part of a cluster). ``devices``: this
    machine's (engines placed here); ``ray_host``: the address engines placed elsewhere
    reach the router's telemetry at (``Backend.telemetry_host``)."""
    port_free = port_free or port_is_free
    backend = backend_class(cfg.cluster.backend)
    backend.check_only(only)
    cfg = select(cfg, only)
    ports = PortPlan(cfg, port_free)
    router = cfg.router if only else resolve_router(cfg, run_dir, ports)
    draft = dataclasses.replace(
        cfg, router=router, engines=backend.resolve_engines(cfg, run_dir, ports),
        launcher=dataclasses.replace(cfg.launcher, run_dir=str(run_dir)))
    resolved = parse_launch_config(draft.to_dict(), cfg.source, run_dir)
    warnings: list[str] = []
    routers = [] if only else router_processes(resolved, run_dir, python)
    remote = dataclasses.replace(  # entries placed at start have no port yet
        resolved, engines=[e for e in resolved.engines if e.remote]).instances()
    engines = backend.plan_engines(resolved, run_dir, python, devices, ray_host, port_free,
                                   warnings)
    return Plan(resolved, run_dir, engines, routers, remote,
                backend.describe(resolved, devices), warnings, ray_host, python)
