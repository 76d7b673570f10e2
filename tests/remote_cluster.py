"""A typed cluster of remote engines for the core's tests: ``RouterConfig`` and
``EngineConfig`` built directly (each field checked by its type; no file, no launcher)."""

from __future__ import annotations

from typing import Any, Mapping

from router.config import ClusterConfig, EngineConfig, RouterConfig


def remote_cluster(policy: str, engines: Mapping[str, str], *,
                   max_model_len: int | None = None, url: str = "http://{name}",
                   endpoints: tuple[str, str] = ("", ""), **router: Any) -> ClusterConfig:
    """Engines ``name -> served model`` at ``url`` (formatted with the name), publishing
    to ``endpoints`` (telemetry, KV events; empty: not subscribed), under ``[router]``
    settings ``policy`` and ``router``."""
    return ClusterConfig(
        source="test.toml", router=RouterConfig(policy=policy, **router),
        engines=[EngineConfig(name=name, served_model_name=model, url=url.format(name=name),
                              telemetry_endpoint=endpoints[0], kv_events_endpoint=endpoints[1],
                              max_model_len=max_model_len)
                 for name, model in engines.items()])
