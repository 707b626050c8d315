"""Which headers cross the proxy, in each direction (cases B20, B21).

Upstream-bound: an ALLOWLIST only. The client's ``Authorization`` / ``x-api-key`` hold the
proxy-facing key and are never relayed; the backend's own configured key is set instead.
``Cookie``, ``Host``, ``Content-Length``, ``Proxy-*``, ``X-Forwarded-*`` and everything else not
listed are dropped. ``anthropic-beta`` keeps its comma list intact (B20).

Client-bound: the upstream's request id, rate-limit and ``x-engine-*`` (engine-side TTFT,
prompt and cached tokens) headers, plus the proxy's own ``x-prefixgate-*`` headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from config.schema import Backend

# Exact names (lower case) forwarded upstream.
UPSTREAM_ALLOW = frozenset({
    "anthropic-version", "anthropic-beta",
    "openai-organization", "openai-project", "openai-beta",
    "x-request-id", "x-client-request-id", "request-id", "idempotency-key",
    "user-agent",
})
# Prefixes forwarded upstream: the SDKs' own telemetry headers (x-stainless-os, ...).
UPSTREAM_ALLOW_PREFIXES = ("x-stainless-",)

DOWNSTREAM_ALLOW = frozenset({
    "x-request-id", "request-id", "openai-processing-ms", "openai-version", "retry-after",
    "anthropic-organization-id",
})
DOWNSTREAM_ALLOW_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "x-engine-")

DEFAULT_ANTHROPIC_VERSION = "2023-06-01"

REDACTED_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})


def upstream_headers(client: Iterable[tuple[str, str]], backend: Backend,
                     api_key: str | None) -> dict[str, str]:
    """Headers for the upstream request.

    ``client``: the client's (name, value) pairs; ``api_key``: the backend's resolved key (or
    None). Anthropic backends get ``x-api-key`` and a default ``anthropic-version``; the others
    get ``Authorization: Bearer``. Always ``Accept-Encoding: identity`` so SSE bytes arrive
    uncompressed and can be relayed event by event (B10).
    """
    out: dict[str, str] = {}
    for name, value in client:
        low = name.lower()
        if low in UPSTREAM_ALLOW or low.startswith(UPSTREAM_ALLOW_PREFIXES):
            out[low] = value
    out["accept-encoding"] = "identity"
    out["content-type"] = "application/json"
    if backend.kind == "anthropic":
        out.setdefault("anthropic-version", DEFAULT_ANTHROPIC_VERSION)
        if api_key:
            out["x-api-key"] = api_key
    elif api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def downstream_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    """The upstream response headers the client gets back (request ids, rate limits)."""
    out: dict[str, str] = {}
    for name, value in upstream.items():
        low = name.lower()
        if low in DOWNSTREAM_ALLOW or low.startswith(DOWNSTREAM_ALLOW_PREFIXES):
            out[low] = value
    return out


def redacted(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers safe to log: credentials and cookies replaced by ``<redacted>``."""
    return {k: ("<redacted>" if k.lower() in REDACTED_HEADERS else v) for k, v in headers}
