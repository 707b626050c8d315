"""What a connection and its request pass before any proxy logic (layer 1): the HTTP server's
limits, path middleware, body reading and checks, header hygiene, proxy keys, rate limits, tenants.
"""

from __future__ import annotations

from prefixgate.proxy.http.auth import Guard
from prefixgate.proxy.http.body import parse_json, read_body_within
from prefixgate.proxy.http.middleware import BarePaths, TrailingSlash
from prefixgate.proxy.http.tenants import tenant_for

__all__ = ["BarePaths", "Guard", "TrailingSlash", "parse_json", "read_body_within", "tenant_for"]
