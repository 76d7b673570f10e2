"""Routing policies: one module each, a registry by name (see ``registry``)."""

from router.policies.registry import POLICIES, build_policy, validate_settings

__all__ = ["POLICIES", "build_policy", "validate_settings"]
