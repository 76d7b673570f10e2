"""Engines joining and leaving a running router's cluster (``POST /admin/engines/...``):
the file's rules hold for every engine set it goes through."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from router.config.cluster import ClusterConfig, ConfigError
from router.config.engines import decode_engine
from router.settings import SettingsError, check


def with_engine(cfg: ClusterConfig, table: Mapping[str, Any],
                served: Collection[str] | None = None,
                models: Mapping[str, str] | None = None) -> ClusterConfig:
    """``cfg`` with one more engine entry: a replica the launcher started while the router
    runs (``POST /admin/engines/{name}/add``). It must be an entry with a ``url``, a new
    instance name and a model already served (a new model needs a router restart: its
    policy was built for the models it had); checked as in a file (ConfigError).
    ``served``: the models served (default: those of ``cfg``'s engines; a router's models
    also count when other workers' removals left them without an engine). ``models``: the
    model each served name was started with (default: those of ``cfg``'s engines); an
    engine of another model under that name is refused even when the name has no engine
    left, since the policy's predictors and profiles were built for the first."""
    source = f"{cfg.source} (added engine)"
    try:
        e = decode_engine(dict(table), len(cfg.engines), Path(cfg.source).parent)
        key = f"engines.{e.name}"
        check(f"{key}.url", e.remote, "an added engine needs its url")
        check(f"{key}.name", e.name not in {i.name for i in cfg.instances()},
              f"{e.name!r} is already an engine instance")
        check(f"{key}.served_model_name",
              e.served_model_name in (served if served is not None
                                      else {x.served_model_name for x in cfg.engines}),
              f"{e.served_model_name!r} is not served here; a new model needs a restart of "
              "the router")
        first = (models if models is not None
                 else {x.served_model_name: x.model for x in cfg.engines}).get(e.served_model_name)
        check(f"{key}.model", first is None or e.model == first,
              f"{e.served_model_name!r} is served by {first!r} here, not {e.model!r}; "
              "another model needs a restart of the router")
        new = dataclasses.replace(cfg, engines=[*cfg.engines, e])
        new.verify_engines()
    except SettingsError as err:
        raise ConfigError(source, err.key, err.problem) from None
    return new


def without_engine(cfg: ClusterConfig, name: str, last: bool = False) -> ClusterConfig:
    """``cfg`` without the engine entry ``name``: one with a ``url`` (the launcher's
    placed or added replicas), not the last of its model unless ``last`` (ConfigError).
    An admin call is refused the last engine of a model; another router worker's removal
    (``last=True``) was ordered after the calls it won over and is applied as is."""
    e = next((x for x in cfg.engines if x.name == name), None)
    if e is None or not e.remote:
        raise ConfigError(cfg.source, f"engines.{name}", "no engine entry of that name with a "
                          "url (only engines the launcher placed or added can be removed)")
    if not last and sum(x.replicas for x in cfg.engines
                        if x.served_model_name == e.served_model_name) == 1:
        raise ConfigError(cfg.source, f"engines.{name}", f"the last engine of model "
                          f"{e.served_model_name!r}")
    return dataclasses.replace(cfg, engines=[x for x in cfg.engines if x is not e])
