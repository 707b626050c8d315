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
  >= 0.9 does the same with its block hashes (vLLM docs, "cache_salt", 2025). The salt is an
  HMAC of the tenant under the proxy's secret (:mod:`prefixgate.proxy.http.salt_key`: nobody
  without the secret can compute a tenant's salt; no secret, no request), so neither the
  tenant's name nor a salt anyone could compute leaves the proxy; a client's own ``cache_salt``
  is folded in, never dropped;
- a hosted API's prompt cache only through per-tenant upstream keys (``backends.X.tenant_keys``,
  :meth:`prefixgate.proxy.routing.router.Target.api_key`): the provider keeps one cache per
  organisation, so every tenant sent with the proxy's one key shares it.
  :func:`shared_cache_warnings` says so at startup for each backend where tenants share a cache.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Backend, Policy, ProxyKey
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import InvalidHeader
from prefixgate.proxy.http.auth import Guard
from prefixgate.proxy.http.salt_key import SaltKey

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
    """An in-process name of ``tenant``'s cache namespace (64 hex digits, the client's salt
    folded in): the same equality classes as the wire salt, for models inside the proxy (the
    counterfactual keeps salted prefixes apart with it). NEVER sent: anyone can compute it; the
    wire carries :meth:`SaltKey.salt <prefixgate.proxy.http.salt_key.SaltKey.salt>`."""
    seed = "prefixgate-tenant|" + tenant
    if client_salt:
        seed += "|client|" + client_salt
    return hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()


def salted_body(raw: bytes, tenant: str, backend: Backend, key: SaltKey) -> bytes:
    """The upstream bytes ``raw`` (an OpenAI-wire JSON object) with the tenant's keyed
    ``cache_salt`` (``key``: the process's :class:`SaltKey`).

    Unchanged when the tenant is empty or the backend does not take a salt. The field is spliced
    in before the object's closing brace (no second parse of a large body) unless the body
    already holds a ``cache_salt``, which is then replaced by the folded salt (one re-encode,
    numbers kept exact). Raises TenantSaltUnavailable (424) when a salt is due and there is no
    secret (fail closed, :mod:`prefixgate.proxy.http.salt_key`); ValueError if ``raw`` is not a
    JSON object (the proxy has parsed and checked it before; a bridge produced it)."""
    if not tenant or not salts(backend):
        return raw
    if b'"cache_salt"' in raw:
        body = exactjson.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("upstream body is not a JSON object")
        client = body.get(SALT_FIELD)
        body[SALT_FIELD] = key.salt(tenant, client if isinstance(client, str) else None)
        return exactjson.dumps(body)
    end = raw.rstrip().rfind(b"}")
    if end < 0:
        raise ValueError("upstream body is not a JSON object")
    head = raw[:end].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + b'"cache_salt":"' + key.salt(tenant).encode() + b'"' + raw[end:]


def tenancy_possible(policy: Policy) -> bool:
    """Whether requests of two different tenants can reach this proxy: the header names
    tenants, a keys file may hold keys of several, or the inline keys name two tenants."""
    if policy.tenants.header == "on" or policy.auth.keys_file:
        return True
    return len({k.tenant or k.id for k in policy.auth.keys}) > 1


def tenants_present(policy: Policy, keys: Iterable[ProxyKey] | None = None) -> bool:
    """Whether two tenants can meet in this proxy now: the header names tenants, or the keys
    there are (``keys``: inline and the keys file's, as the key store reads them; None: the
    policy's inline keys and, with a keys file, "maybe" as :func:`tenancy_possible` says) belong
    to two tenants or more. A keys file that holds one tenant's keys, or none — the default
    keys file every policy reads — is no tenancy (issue 37, item 6: the shipped policy warned
    twice that tenants could read each other's prefixes to a user with no tenant)."""
    if keys is None:
        return tenancy_possible(policy)
    if policy.tenants.header == "on":
        return True
    return len({k.tenant or k.id for k in [*policy.auth.keys, *keys]}) > 1


def shared_cache_warnings(policy: Policy, keys: Iterable[ProxyKey] | None = None) -> list[str]:
    """One line per backend whose prefix cache tenants share (empty without tenants,
    :func:`tenants_present` with ``keys``): a backend that takes no ``cache_salt`` and sends
    every tenant with one upstream key. Hosted APIs keep one prompt cache per organisation, so a
    tenant can read another's cached prefix (its cached tokens and TTFT show it); the fix is
    ``tenant_keys`` (a key of each tenant's own organisation) or, on an engine that reads it
    (ours, vLLM >= 0.9), ``cache_salt: true``."""
    if not tenants_present(policy, keys):
        return []
    out = []
    for name, b in sorted(policy.backends.items()):
        if salts(b) or (b.tenant_keys and b.tenant_keys_required):
            continue
        hosted = traits(b.kind).cache_provider in ("openai", "anthropic")
        who = "tenants without an entry in tenant_keys" if b.tenant_keys else "all tenants"
        fix = ("give each tenant its own upstream key: backends." + name + ".tenant_keys: "
               "{<tenant>: ${ENV}} (+ tenant_keys_required: true)") if hosted else (
               "set backends." + name + ".cache_salt: true if it reads cache_salt (vLLM >= 0.9, "
               "prefixgate's engine), or give tenants separate backends")
        out.append(f"backend {name!r}: {who} share one upstream key, so one "
                   f"{'provider' if hosted else 'engine'} prefix cache: a tenant can read "
                   f"another's cached prompt prefix (cached tokens, TTFT); {fix}")
    return out
