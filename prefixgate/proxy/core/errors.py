"""Every error the proxy answers with, and the ONE place they become HTTP responses.

Handlers raise a specific :class:`ProxyError` subclass; :func:`error_response` turns it into a
body in the caller's API shape with the right status:

- OpenAI (``/v1/chat/completions``, ``/v1/models``)::

      {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

- Anthropic (``/v1/messages``)::

      {"type": "error", "error": {"type": str, "message": str}}

Statuses follow the providers' own docs: malformed / invalid body 400 (also a header value that
cannot be sent, and JSON nested deeper than ``limits.max_json_depth``), missing or wrong proxy key
401, a key over its per-minute limits 429 with ``retry-after``, a body not received within
``limits.body_timeout_s`` 408, unknown model 404
(``model_not_found``), body over ``policy.max_body_bytes`` 413 (case B19), a route whose backend
cannot take this API 501, upstream unreachable 502, upstream too slow 504,
client gone before its body was complete 499 (for the ledger; nobody reads it). An upstream's own 4xx
/ 5xx is not a ProxyError: the relay passes its status and body through unchanged, except a body
that is not JSON (an HTML error page), which :func:`upstream_error_body` puts in the caller's shape.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import Any, Literal

import orjson
from starlette.responses import Response

Api = Literal["openai", "anthropic"]
log = logging.getLogger("prefixgate.errors")

# Anthropic's error "type" per HTTP status (docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    501: "invalid_request_error",
    502: "api_error",
    504: "api_error",
}


def quoted(name: str) -> str:
    """``name`` (a param path, whose JSON keys may be any text) between single quotes for an
    error message: whitespace, quotes, backslashes and control / format characters become
    ``\\uXXXX`` (``\\UXXXXXXXX`` beyond the BMP), so the quoted name is one unbroken token an
    Anthropic-shaped error (no ``param`` field) can be read back from. E.g. ``a b`` ->
    ``'a\\u0020b'``; the empty key ``""`` -> ``'""'``."""
    if not name:
        return "'\"\"'"
    out = []
    for ch in name:
        if ch.isspace() or ch in "'\\" or unicodedata.category(ch) in ("Cc", "Cf"):
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


class ProxyError(Exception):
    """Base class: ``status`` (HTTP), ``type`` (OpenAI error type), ``code``, ``param``;
    ``headers``: extra response headers (e.g. ``retry-after``), None for none."""

    status = 500
    type = "server_error"
    code: str | None = None
    headers: dict[str, str] | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidJSON(ProxyError):
    """The body is not parseable JSON (or not a JSON object)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_json"


class InvalidRequest(ProxyError):
    """A required field is missing or has the wrong type; ``param`` names it."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class InvalidHeader(ProxyError):
    """A header value the proxy cannot send on (a character outside latin-1, CR / LF / NUL);
    ``param`` names the header. HTTP header values are bytes (RFC 9110 5.5): what the client
    sent is passed through byte for byte, so this is only raised for values built as text."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_header"


class NestingTooDeep(ProxyError):
    """The JSON body nests arrays / objects deeper than ``limits.max_json_depth``; ``param`` is
    the JSON path where the limit was passed (``messages[0].content[0]...``)."""

    status = 400
    type = "invalid_request_error"
    code = "nesting_too_deep"


class RequestTimeout(ProxyError):
    """The client did not finish sending its body within ``limits.body_timeout_s`` (a slow or
    stalled upload holding a connection open)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class HeadersTooLarge(ProxyError):
    """The request line and headers are larger than ``limits.max_header_bytes`` (431, RFC 6585
    section 5). Sent by the connection protocol (:mod:`prefixgate.proxy.http.server`) before any
    route runs."""

    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class Unauthorized(ProxyError):
    """Proxy keys are configured and the request carries no valid one (OpenAI ``Authorization:
    Bearer``, Anthropic ``x-api-key``). Code as OpenAI words it: ``invalid_api_key``."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class RateLimited(ProxyError):
    """The key is over its requests- or tokens-per-minute limit; ``retry_after_s`` (whole
    seconds, >= 1) goes out as the ``retry-after`` header (RFC 9110 10.2.3)."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: int, *, kind: str = "requests") -> None:
        super().__init__(message)
        self.type = kind
        self.retry_after_s = max(1, int(retry_after_s))
        self.headers = {"retry-after": str(self.retry_after_s)}


class UnknownEndpoint(ProxyError):
    """No endpoint at this path (404) or not for this method (405); ``status`` per instance.
    Message as OpenAI words it: ``Invalid URL (POST /v1/responses)``, then ``hint`` when given
    (what to change, e.g. the ``base_url`` of a doubled ``/v1/v1``)."""

    status = 404
    type = "invalid_request_error"
    code = "unknown_url"

    def __init__(self, method: str, path: str, status: int, hint: str = "") -> None:
        what = "Invalid URL" if status == 404 else "Method not allowed"
        super().__init__(f"{what} ({method} {path})" + (f": {hint}" if hint else ""))
        self.status = status


class ModelNotFound(ProxyError):
    """No route of the policy matches the requested model."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class BodyTooLarge(ProxyError):
    """The body is larger than ``policy.max_body_bytes`` (case B19)."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class NotSupported(ProxyError):
    """The route's backend cannot serve this API (e.g. an OpenAI client to an Anthropic-only
    backend, a translation the proxy does not implement)."""

    status = 501
    type = "invalid_request_error"
    code = "unsupported_route"


class UpstreamUnavailable(ProxyError):
    """The backend could not be reached (connection refused, DNS, TLS)."""

    status = 502
    type = "server_error"
    code = "upstream_unavailable"


class UpstreamTimeout(ProxyError):
    """The backend did not answer within its ``timeout_s``."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"


class MissingBackendKey(ProxyError):
    """The backend's ``${ENV}`` key is not set in the proxy's environment: a configuration
    error no retry can fix. 424 (Failed Dependency, RFC 4918 section 11.4), a status the
    OpenAI and Anthropic SDKs do not retry (they retry 408, 409, 429 and 5xx), so the client
    sees the fix at once instead of after three retries (issue 22, item 5)."""

    status = 424
    type = "server_error"
    code = "backend_key_missing"


class TenantSaltUnavailable(ProxyError):
    """A tenant's request to a backend that takes a ``cache_salt`` while the proxy has no usable
    salt secret (:mod:`prefixgate.proxy.http.salt_key`): refused before anything is sent, as a
    configuration error (424, like :class:`MissingBackendKey`: SDKs do not retry it). The
    message names neither the secret's variable nor its file (the proxy log does)."""

    status = 424
    type = "server_error"
    code = "tenant_salt_unavailable"


class Forbidden(ProxyError):
    """The caller's key may not do this (a backend that requires a per-tenant upstream key the
    caller's tenant has none of; another tenant's figures). 403."""

    status = 403
    type = "permission_error"
    code = "forbidden"


class LedgerUnreadable(ProxyError):
    """The savings ledger's database cannot be read now (a shared PostgreSQL ledger down or
    hung): 503 with ``retry-after``, so a dashboard polls again instead of showing a bug."""

    status = 503
    type = "server_error"
    code = "ledger_unavailable"
    headers = {"retry-after": "5"}


class ClientDisconnected(ProxyError):
    """The client went away before its request body was complete. 499 is nginx's "client
    closed request"; nobody reads the answer, the status is for the ledger."""

    status = 499
    type = "invalid_request_error"
    code = "client_disconnect"


class InternalError(ProxyError):
    """A bug in the proxy: answered as a 500 in the caller's shape, logged with its traceback."""

    status = 500
    type = "server_error"
    code = "internal_error"

    @classmethod
    def wrap(cls, exc: BaseException) -> InternalError:
        """Log ``exc`` and return the error the client sees (no internals in the message)."""
        log.error("internal error", exc_info=exc)
        return cls(f"prefixgate internal error ({type(exc).__name__}); see the proxy log")


def error_body(exc: ProxyError, api: Api) -> dict[str, Any]:
    """The JSON error body for ``exc`` in ``api``'s shape (see module docstring)."""
    if api == "anthropic":
        kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": exc.message}}
    return {"error": {"message": exc.message, "type": exc.type, "param": exc.param,
                      "code": exc.code}}


def error_response(exc: ProxyError, api: Api, headers: dict[str, str] | None = None) -> Response:
    """``exc`` as an HTTP response: status ``exc.status``, JSON body from :func:`error_body`,
    headers ``exc.headers`` (``retry-after``) then ``headers``."""
    merged = {**(exc.headers or {}), **(headers or {})}
    return Response(orjson.dumps(error_body(exc, api)), status_code=exc.status,
                    media_type="application/json", headers=merged or None)


def upstream_error_body(raw: bytes, status: int, api: Api) -> dict[str, Any]:
    """An upstream error whose body is not a JSON object (a load balancer's HTML page, an empty
    body) as an error body in ``api``'s shape: the message names the upstream status and quotes
    at most 500 characters of its text. The HTTP status stays the upstream's."""
    text = " ".join(raw.decode("utf-8", errors="replace").split())[:500]
    message = f"upstream answered HTTP {status}" + (f": {text}" if text else " with an empty body")
    if api == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                           "message": message}}
    return {"error": {"message": message,
                      "type": "server_error" if status >= 500 else "invalid_request_error",
                      "param": None, "code": "upstream_error"}}


_KIND = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def upstream_error_kind(raw: bytes) -> str:
    """What kind of error an upstream's JSON error body names, for the ledger: its ``code``,
    else its ``type`` (OpenAI ``{"error": {"code", "type"}}``, Anthropic ``{"type": "error",
    "error": {"type"}}``, vLLM / llama.cpp the same shapes), e.g. ``context_length_exceeded``,
    ``invalid_request_error``; ``""`` when it names none. Only an identifier-like word (at most
    64 characters) is taken — never the message, which may quote the prompt."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return ""
    for key in ("code", "type"):
        v = err.get(key)
        if isinstance(v, str) and _KIND.fullmatch(v):
            return v
    return ""


def stream_error_event(exc: ProxyError, api: Api) -> bytes:
    """``exc`` as the last SSE event of a stream that already answered 200 (the upstream broke
    off or went silent mid-stream): Anthropic ``event: error`` + ``data: {"type": "error",
    "error": {...}}`` (its own mid-stream error event), OpenAI ``data: {"error": {...}}`` (what
    the OpenAI SDKs raise ``APIError`` on)."""
    data = b"data: " + orjson.dumps(error_body(exc, api)) + b"\n\n"
    return b"event: error\n" + data if api == "anthropic" else data


def api_for_path(path: str) -> Api:
    """Which error shape a request path expects: ``/v1/messages*`` -> anthropic, else openai."""
    return "anthropic" if path.startswith("/v1/messages") else "openai"
