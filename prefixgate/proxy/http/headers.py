"""Which headers cross the proxy, in each direction (cases B20, B21).

Upstream-bound: an ALLOWLIST only. The client's ``Authorization`` / ``x-api-key`` hold the
proxy-facing key and are never relayed; the backend's own configured key is set instead.
``Cookie``, ``Host``, ``Content-Length``, ``Proxy-*``, ``X-Forwarded-*`` and everything else not
listed are dropped. ``anthropic-beta`` keeps its comma list intact (B20).

Client-bound: the upstream's request id, rate-limit and ``x-engine-*`` (engine-side TTFT,
prompt and cached tokens) headers, plus the proxy's own ``x-prefixgate-*`` headers.

Encoding, both directions: an HTTP header value is a sequence of bytes (RFC 9110 5.5; obs-text
0x80-0xFF is allowed). Starlette hands the proxy the client's bytes decoded as latin-1, which maps
every byte to one character and back, so upstream-bound values are re-encoded as latin-1: a
``User-Agent`` holding UTF-8 (``é`` = ``C3 A9``) reaches the backend as the same two bytes.
httpx would encode a str value as ASCII and raise; Starlette encodes response values as latin-1.
A value built as text that latin-1 cannot carry, or that holds CR / LF / NUL, is refused with
:class:`~prefixgate.proxy.core.errors.InvalidHeader` (400 naming the header) instead of a crash. Client-bound
values are read from the upstream's raw bytes (:func:`pin_latin1`) and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Backend
from prefixgate.proxy.core.errors import InvalidHeader, MissingBackendKey

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
_FORBIDDEN = ("\r", "\n", "\x00")  # never valid in a field value (RFC 9110 5.5)


def wire_value(name: str, value: str) -> bytes:
    """``value`` as the bytes of a header field value: latin-1, one byte per character, so a
    value Starlette decoded from the client's bytes goes out as those same bytes. Raises
    InvalidHeader (400, ``param`` = ``name``) for a character above U+00FF or CR / LF / NUL."""
    if any(c in value for c in _FORBIDDEN):
        raise InvalidHeader(f"Header '{name}' holds a line break or NUL, which no HTTP header "
                            "value may contain.", param=name)
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError as e:
        raise InvalidHeader(f"Header '{name}' holds the character {value[e.start]!r} at "
                            f"position {e.start}, which an HTTP header cannot carry; send it "
                            "percent- or base64-encoded.", param=name) from None


def _backend_key_value(name: str, value: str) -> bytes:
    try:
        return wire_value(name, value)
    except InvalidHeader:  # the operator's key, not the client's request: a shaped 500
        raise MissingBackendKey(f"the backend's configured API key cannot be sent as the "
                                f"'{name}' header (a character outside latin-1 or a line "
                                "break); check the environment variable") from None


def upstream_headers(client: Iterable[tuple[str, str]], backend: Backend,
                     api_key: str | None) -> dict[str, bytes]:
    """Headers for the upstream request, name (lower case) -> value BYTES.

    ``client``: the client's (name, value) pairs as Starlette gives them (latin-1 decoded);
    ``api_key``: the backend's resolved key (or None). Anthropic backends get ``x-api-key`` and
    a default ``anthropic-version``; the others get ``Authorization: Bearer``. Always
    ``Accept-Encoding: identity`` so SSE bytes arrive uncompressed and can be relayed event by
    event (B10). Raises InvalidHeader (400) for a client value that cannot be sent (see
    :func:`wire_value`), MissingBackendKey (500) for a backend key that cannot.
    """
    out: dict[str, bytes] = {}
    for name, value in client:
        low = name.lower()
        if low in UPSTREAM_ALLOW or low.startswith(UPSTREAM_ALLOW_PREFIXES):
            out[low] = wire_value(low, value)
    out["accept-encoding"] = b"identity"
    out["content-type"] = b"application/json"
    if traits(backend.kind).wire == "anthropic":
        out.setdefault("anthropic-version", DEFAULT_ANTHROPIC_VERSION.encode())
        if api_key:
            out["x-api-key"] = _backend_key_value("x-api-key", api_key)
    elif api_key:
        out["authorization"] = _backend_key_value("authorization", f"Bearer {api_key}")
    return out


def pin_latin1(headers: object) -> None:
    """Make an ``httpx.Headers`` decode its values as latin-1 (one character per byte).

    httpx picks ASCII, else UTF-8, else latin-1 per response: a UTF-8 value then decodes to
    characters above U+00FF that Starlette cannot encode again (a crash), and a value in
    0x80-0xFF changes bytes on the way out. Pinned, every value round-trips to the upstream's
    bytes. Anything without an ``encoding`` attribute is left alone."""
    if hasattr(headers, "encoding"):
        headers.encoding = "iso-8859-1"


def downstream_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    """The upstream response headers the client gets back (request ids, rate limits).

    Values are the upstream's bytes as latin-1 text (see :func:`pin_latin1`), so Starlette
    writes back exactly the bytes the upstream sent."""
    pin_latin1(upstream)
    out: dict[str, str] = {}
    for name, value in upstream.items():
        low = name.lower()
        if low in DOWNSTREAM_ALLOW or low.startswith(DOWNSTREAM_ALLOW_PREFIXES):
            out[low] = value
    return out


def redacted(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers safe to log: credentials and cookies replaced by ``<redacted>``."""
    return {k: ("<redacted>" if k.lower() in REDACTED_HEADERS else v) for k, v in headers}
