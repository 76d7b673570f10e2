"""Policies by name, settings validation (the config loader calls it) and construction."""

from __future__ import annotations

from typing import Any, Mapping

from router.policies.base import Policy
from router.policies.cascade import Cascade
from router.policies.chimera import Chimera
from router.policies.dynamo import Dynamo
from router.policies.laar import Laar
from router.policies.linear import Linear
from router.policies.lmetric import LMetric
from router.policies.prefix_filter import PrefixFilter
from router.policies.random_baseline import RandomPolicy
from router.policies.random_mix import RandomMix
from router.policies.round_robin import RoundRobin
from router.policies.routebalance import RouteBalance
from router.policies.shortest_queue import ShortestQueue
from router.policies.vinelm import VineLM
from router.policies.vllm_balancer import VllmBalancer
from router.predictors.base import PredictorSet
from router.settings import SettingsError, decode
from router.types import ClusterInfo

POLICIES: dict[str, type[Policy[Any]]] = {p.name: p for p in (
    Chimera, LMetric, RouteBalance, Laar, RoundRobin, RandomPolicy, VllmBalancer,
    ShortestQueue, Linear, PrefixFilter, Dynamo, VineLM, RandomMix, Cascade)}


def validate_settings(name: str, table: Mapping[str, Any]) -> Any:
    """The settings dataclass of policy ``name`` from its ``[router.policies.<name>]``
    table; ``SettingsError`` naming the policy or key that is wrong."""
    if name not in POLICIES:
        raise SettingsError(f"router.policies.{name[:80]}", f"unknown policy {name[:80]!r}; "
                            f"known policies: {', '.join(POLICIES)}")
    return decode(POLICIES[name].Settings, table, f"router.policies.{name}")


def build_policy(name: str, all_settings: Mapping[str, Mapping[str, Any]],
                 cluster: ClusterInfo, predictors: PredictorSet) -> Policy[Any]:
    """Validate every settings table and build policy ``name`` (ValueError if it cannot
    start: bad settings, a missing predictor or profile)."""
    for table_name, table in all_settings.items():
        validate_settings(table_name, table)

    def build(policy: str) -> Policy[Any]:
        settings = validate_settings(policy, all_settings.get(policy, {}))
        return POLICIES[policy](settings, cluster, predictors, build)

    return build(name)
