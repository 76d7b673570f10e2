"""Routing policies: one module each, a registry by name (see ``registry``)."""

from router.policies.base import (Decision, NoEngineAvailable, RoutingRequest,
                                  WorkflowMeta)
from router.policies.registry import POLICIES, build_policy, validate_settings

__all__ = ["POLICIES", "Decision", "NoEngineAvailable", "RoutingRequest", "WorkflowMeta",
           "build_policy", "validate_settings"]
