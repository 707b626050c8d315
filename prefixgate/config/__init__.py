"""Policy schema, loader, default policy, the backend-kind table and dated tables (prices, cache
minimums)."""

from prefixgate.config.backend_kinds import BACKEND_KINDS, KindTraits, traits
from prefixgate.config.loader import PolicyError, default_policy, load_policy, parse_policy, resolve_route
from prefixgate.config.schema import Backend, LedgerSettings, Listen, Policy, RewriteSettings, Route

__all__ = [
    "BACKEND_KINDS", "Backend", "KindTraits", "LedgerSettings", "Listen", "Policy", "PolicyError",
    "RewriteSettings", "Route",
    "default_policy", "load_policy", "parse_policy", "resolve_route", "traits",
]
