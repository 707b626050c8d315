"""Tenants: who a request belongs to, and the namespaces that keep tenants apart (issue 10, item 5).

The tenant of a request (:func:`tenant_for`):

- with proxy keys (``auth``): the key's ``tenant`` (its ``id`` when unset). With
  ``tenants.header: on`` the ``x-prefixgate-tenant`` header names a sub-tenant inside it
  (``<key tenant>/<header>``), so a key holder can split its own traffic but never reach another
  key's namespace;
- without keys: the header when ``tenants.header: on``, else ``""`` (no tenant, single-tenant
  proxy, exactly the behaviour before tenants existed).

A header value must match ``[A-Za-z0-9_.-]{1,64}``; anything else is a 400 in the caller's shape
(:class:`~prefixgate.proxy.core.errors.InvalidHeader`) — a tenant name goes into the ledger and into Redis
keys.

What a tenant namespaces:

- session memory: the session id becomes ``t:<tenant>|<id>`` (:func:`namespaced_session`), so
  two tenants sending the same conversation (or the same ``x-prefixgate-session``) never read each
  other's memory;
- the ledger: the row's ``tenant`` column;
- the backend's prefix cache: a ``cache_salt`` body field (:func:`salted_body`), sent to backends
  with ``cache_salt`` on (default: ``local``). Our engine keys its radix tree by it
  (``local_engine.radix_cache`` ``extra_key``: different salts never share a prefix) and vLLM
  >= 0.9 does the same with its block hashes (vLLM docs, "cache_salt", 2025). The salt is
  ``sha256("prefixgate-tenant|" + tenant)``, so the tenant's name does not leave the proxy; a
  client's own ``cache_salt`` is folded in, never dropped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Backend, Policy
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import InvalidHeader
from prefixgate.proxy.http.auth import Guard

TENANT_HEADER = "x-prefixgate-tenant"
_TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SALT_FIELD = "cache_salt"


def tenant_for(headers: Mapping[str, str], key_id: str, policy: Policy, guard: Guard) -> str:
    """The request's tenant (module docstring); ``key_id``: what :meth:`Guard.admit` returned
    ("" without keys). Raises InvalidHeader (400) for a malformed tenant header."""
    sub = _header_tenant(headers) if policy.tenants.header == "on" else ""
    if not key_id:
        return sub
    key = next((k for k in guard.store.keys() if k.id == key_id), None)
    base = (key.tenant if key is not None and key.tenant else key_id)
    return f"{base}/{sub}" if sub else base


def _header_tenant(headers: Mapping[str, str]) -> str:
    raw = headers.get(TENANT_HEADER)
    if raw is None:
        return ""
    value = raw.strip()
    if not _TENANT_RE.match(value):
        raise InvalidHeader(f"The {TENANT_HEADER} header must be 1-64 characters of "
                            "A-Z a-z 0-9 _ . -", param=TENANT_HEADER)
    return value


def namespaced_session(tenant: str, session_id: str) -> str:
    """``session_id`` inside ``tenant``'s namespace (unchanged for the empty tenant)."""
    return f"t:{tenant}|{session_id}" if tenant else session_id


def salts(backend: Backend) -> bool:
    """Whether requests to ``backend`` carry the tenant's ``cache_salt`` (module docstring)."""
    return backend.cache_salt if backend.cache_salt is not None else traits(backend.kind).default_cache_salt


def tenant_salt(tenant: str, client_salt: str | None = None) -> str:
    """The ``cache_salt`` for ``tenant`` (64 hex digits), with the client's own salt folded in."""
    seed = "prefixgate-tenant|" + tenant
    if client_salt:
        seed += "|client|" + client_salt
    return hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()


def salted_body(raw: bytes, tenant: str, backend: Backend) -> bytes:
    """The upstream bytes ``raw`` (an OpenAI-wire JSON object) with the tenant's ``cache_salt``.

    Unchanged when the tenant is empty or the backend does not take a salt. The field is spliced
    in before the object's closing brace (no second parse of a large body) unless the body
    already holds a ``cache_salt``, which is then replaced by the folded salt (one re-encode,
    numbers kept exact). Raises ValueError if ``raw`` is not a JSON object (the proxy has parsed
    and checked it before; a bridge produced it)."""
    if not tenant or not salts(backend):
        return raw
    if b'"cache_salt"' in raw:
        body = exactjson.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("upstream body is not a JSON object")
        client = body.get(SALT_FIELD)
        body[SALT_FIELD] = tenant_salt(tenant, client if isinstance(client, str) else None)
        return exactjson.dumps(body)
    end = raw.rstrip().rfind(b"}")
    if end < 0:
        raise ValueError("upstream body is not a JSON object")
    head = raw[:end].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + b'"cache_salt":"' + tenant_salt(tenant).encode() + b'"' + raw[end:]
