"""Policies by name, settings validation (the config loader calls it) and construction
(with the engine pickers they name, ``router.policies.pickers``)."""

from __future__ import annotations

from typing import Any, Mapping

from router.policies.base import Policy
from router.policies.cascade import Cascade
from router.policies.chimera import Chimera
from router.policies.dynamo import Dynamo
from router.policies.laar import Laar
from router.policies.inputs import INPUTS
from router.policies.linear import Linear
from router.policies.lmetric import LMetric
from router.policies.pickers import PICKERS, Picker
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
    settings = decode(POLICIES[name].Settings, table, f"router.policies.{name}")
    picker = getattr(settings, "picker", None)
    if picker is not None:
        try:
            _check_inputs(picker)
        except ValueError as e:
            raise SettingsError(f"router.policies.{name}.picker", str(e)) from None
    return settings


def build_policy(name: str, all_settings: Mapping[str, Mapping[str, Any]],
                 cluster: ClusterInfo, predictors: PredictorSet) -> Policy[Any]:
    """Validate every settings table and build policy ``name`` (ValueError if it cannot
    start: bad settings, a missing predictor or profile)."""
    for table_name, table in all_settings.items():
        validate_settings(table_name, table)

    build = _Build(all_settings, cluster, predictors)
    return build(name)


def _check_inputs(picker: str) -> None:
    """ValueError if engine picker ``picker`` declares an input the router does not have."""
    unknown = sorted(PICKERS[picker].inputs - INPUTS)
    if unknown:
        raise ValueError(f"engine picker {picker!r} reads {', '.join(unknown)}, which the "
                         f"router does not have; inputs: {', '.join(sorted(INPUTS))}")


def build_picker(name: str, all_settings: Mapping[str, Mapping[str, Any]]) -> Picker:
    """A new engine picker ``name`` (a ``PICKERS`` name: settings validation checked it)
    from the policy tables; ValueError if it declares an input the router does not have,
    or its settings are wrong."""
    _check_inputs(name)
    return PICKERS[name].built(all_settings)


class _Build:
    """The ``BuildPolicy`` a policy gets: its parts from the same tables, cluster and
    predictors."""

    def __init__(self, all_settings: Mapping[str, Mapping[str, Any]], cluster: ClusterInfo,
                 predictors: PredictorSet) -> None:
        self.all_settings, self.cluster, self.predictors = all_settings, cluster, predictors

    def __call__(self, policy: str) -> Policy[Any]:
        settings = validate_settings(policy, self.all_settings.get(policy, {}))
        return POLICIES[policy](settings, self.cluster, self.predictors, self)

    def picker(self, name: str) -> Picker:
        return build_picker(name, self.all_settings)
