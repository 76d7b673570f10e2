"""A typed cluster of remote engines for the core's tests: ``RouterConfig`` and
``RemoteEngine`` built directly (each field checked by its type; no file, no launcher)."""

from __future__ import annotations

from typing import Any, Mapping

from router.config.cluster import ClusterConfig, RouterConfig
from router.config.engines import RemoteEngine


def remote_cluster(policy: str, engines: Mapping[str, str], *,
                   max_model_len: int | None = None, url: str = "http://{name}:8000",
                   endpoints: tuple[str, str] | None = None, **router: Any) -> ClusterConfig:
    """Engines ``name -> served model`` at ``url`` (formatted with the name), publishing
    to ``endpoints`` (telemetry, KV events; default: a path per engine where nothing ever
    publishes), under ``[router]`` settings ``policy`` and ``router``."""
    return ClusterConfig(
        source="test.toml", router=RouterConfig(policy=policy, **router),
        engines=[RemoteEngine(name=name, served_model_name=model, url=url.format(name=name),
                              telemetry_endpoint=(endpoints or silent(name))[0],
                              kv_events_endpoint=(endpoints or silent(name))[1],
                              max_model_len=max_model_len)
                 for name, model in engines.items()])


def silent(name: str) -> tuple[str, str]:
    """Telemetry and KV-event endpoints of engine ``name`` that no publisher binds."""
    return (f"ipc:///nonexistent/hetserve-test/{name}.telemetry",
            f"ipc:///nonexistent/hetserve-test/{name}.kv")
