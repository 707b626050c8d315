"""Serve ``/v1/messages/`` as ``/v1/messages``, without a redirect (issue 8, HTTP hygiene).

Starlette's ``redirect_slashes`` answers a path with a trailing slash by a 307 whose
``Location`` is built from the request's own ``Host`` header: a client (or anything able to set
Host on its way) chooses where the redirect points. The app turns that off
(``FastAPI(redirect_slashes=False)``) and this ASGI middleware strips trailing slashes from the
path before routing instead, so both forms reach the same endpoint and no response ever carries
a URL made from Host.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


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
