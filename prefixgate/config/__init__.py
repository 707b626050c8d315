"""Policy schema, loader, default policy and dated tables (prices, cache minimums)."""

from prefixgate.config.loader import PolicyError, default_policy, load_policy, parse_policy, resolve_route
from prefixgate.config.schema import Backend, LedgerSettings, Listen, Policy, RewriteSettings, Route

__all__ = [
    "Backend", "LedgerSettings", "Listen", "Policy", "PolicyError", "RewriteSettings", "Route",
    "default_policy", "load_policy", "parse_policy", "resolve_route",
]
