"""ASGI middleware that rewrites the request path before routing, with no redirect.

* :class:`TrailingSlash` —Serve ``/v1/messages/`` as ``/v1/messages``, without a redirect (issue 8, HTTP
hygiene).

  Starlette's ``redirect_slashes`` answers a path with a trailing slash by a 307 whose
  ``Location`` is built from the request's own ``Host`` header: a client (or anything able to set
  Host on its way) chooses where the redirect points. The app turns that off
  (``FastAPI(redirect_slashes=False)``) and this ASGI middleware strips trailing slashes from the
  path before routing instead, so both forms reach the same endpoint and no response ever carries
  a URL made from Host.

* :class:`BarePaths` — Serve the API routes without their ``/v1`` prefix (``/chat/completions``,
  ``/messages``, ``/responses``, ...), as clients configured with a bare host
  (``base_url="http://host:8080"``) call them (issue 11, item 2).

  ASGI middleware: a path whose first segment names one of the API's endpoints gets ``/v1`` put
  in front before routing; the route, its error shape (:func:`prefixgate.proxy.core.errors.api_for_path`) and
  the ledger's ``endpoint`` are then those of the ``/v1`` path. ``/healthz`` and ``/metrics`` are
  not API routes and stay as they are.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

API_ROOTS = frozenset({"chat", "messages", "responses", "models", "embeddings", "completions"})


def with_v1(path: str) -> str | None:
    """``/v1`` + ``path`` when ``path``'s first segment is an API root, else None."""
    first = path.lstrip("/").split("/", 1)[0]
    return "/v1" + path if path.startswith("/") and first in API_ROOTS else None


class BarePaths:
    """ASGI middleware: ``/v1`` put in front of a bare API path (module docstring). HTTP scopes only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            new = with_v1(scope.get("path", ""))
            if new is not None:
                scope = dict(scope)
                scope["path"] = new
                raw = scope.get("raw_path")
                if isinstance(raw, bytes):
                    scope["raw_path"] = b"/v1" + raw
        await self.app(scope, receive, send)

class TrailingSlash:
    """ASGI middleware: ``scope["path"]`` / ``raw_path`` without trailing slashes (``/`` stays
    ``/``). HTTP scopes only; everything else passes untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = dict(scope)
            scope["path"] = path.rstrip("/") or "/"
            raw = scope.get("raw_path")
            if isinstance(raw, bytes):
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)
