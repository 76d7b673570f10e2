"""Policies by name, settings validation (the config loader calls it) and construction
(with the engine pickers they name, ``router.policies.pickers``).

Adding a policy: its module in this package, and its line ``"name": "module:Class"`` in
``POLICIES``."""

from __future__ import annotations

from typing import Any, Mapping

from router.policies.base import Policy
from router.policies.inputs import INPUTS
from router.policies.parts import load
from router.policies.pickers import PICKERS, Picker
from router.predictors.base import PredictorSet
from router.settings import SettingsError, decode
from router.types import ClusterInfo

POLICIES: dict[str, type[Policy[Any]]] = load(__package__, Policy, {
    "chimera": "chimera:Chimera",
    "lmetric": "lmetric:LMetric",
    "routebalance": "routebalance:RouteBalance",
    "laar": "laar:Laar",
    "round_robin": "round_robin:RoundRobin",
    "random": "random_baseline:RandomPolicy",
    "vllm": "vllm_balancer:VllmBalancer",
    "shortest_queue": "shortest_queue:ShortestQueue",
    "linear": "linear:Linear",
    "filter": "prefix_filter:PrefixFilter",
    "dynamo": "dynamo:Dynamo",
    "vinelm": "vinelm:VineLM",
    "random_mix": "random_mix:RandomMix",
    "cascade": "cascade:Cascade",
    "online": "online:Online",
})
"""Every policy by name, one line each (``"name": "module:Class"``, docs/policies.md)."""


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
