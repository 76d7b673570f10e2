"""The served model names of a cluster, with the tokenizer and context of each."""

from __future__ import annotations

from dataclasses import dataclass

from router.config.cluster import ClusterConfig, ConfigError


@dataclass(frozen=True)
class ServedModel:
    """A served model name, its model spec and the smallest context among its replicas
    (``None`` when no replica sets ``max_model_len``: the engines then check it)."""

    name: str
    spec: str
    max_model_len: int | None


def served_models(config: ClusterConfig) -> dict[str, ServedModel]:
    """Every served model name of the cluster, with the model whose tokenizer it uses."""
    instances = config.instances()
    out: dict[str, ServedModel] = {}
    for name in dict.fromkeys(i.served_model_name for i in instances):
        replicas = [i for i in instances if i.served_model_name == name]
        specs = [i.model for i in replicas if i.model is not None]
        if not specs:
            raise ConfigError(config.source, f"engines.{replicas[0].engine}.model",
                              f"not set; the router needs the model of '{name}' to load "
                              "its tokenizer")
        lengths = [i.max_model_len for i in replicas if i.max_model_len is not None]
        out[name] = ServedModel(name, specs[0], min(lengths) if lengths else None)
    return out
