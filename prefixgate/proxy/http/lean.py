"""The lean path: the hot model endpoints served without walking the router (issue 25).

Measured first (``bench/framework_cost.py``): a request through FastAPI's whole stack to a
handler that returns at once costs several times the handler's own call — the router tries
each of ~40 routes in turn, and each layer (exception middleware, exit stacks, the route's
request handler with its dependency solving) adds its frame and its allocations. For
``POST /v1/chat/completions`` and ``POST /v1/messages`` — the endpoints an agent calls on every
turn — that is more than the proxy's own work on a small body.

:class:`LeanRoutes` is ASGI middleware installed innermost of the app's own middleware, so the
layers outside it still run exactly as before for every request (the server-error handler, the
path rewriting of :mod:`prefixgate.proxy.http.middleware`). For an HTTP ``POST`` to one of
:data:`LEAN_PATHS` (the path as the router would match it: after those rewrites, with no
``root_path``), it calls the route's endpoint itself, inside Starlette's
:class:`~starlette.middleware.exceptions.ExceptionMiddleware` built with the app's own handlers
(exactly what the full stack builds: every handler but the ``Exception`` / 500 one, which
stays outside), so a :class:`~prefixgate.proxy.core.errors.ProxyError` or an HTTP exception is
answered by the same handler in the same shape, and a bug still reaches the server-error
handler outside. Every other request — another path, another method, a websocket, the
lifespan — goes down the full stack. The routes stay registered with FastAPI: the OpenAPI
document, HEAD / 405 handling and ``app.routes`` are unchanged.

What the lean path does not do, because these endpoints use none of it: FastAPI's dependency
solving and its per-request exit stacks (the handlers take only the ``Request``), and the
router's ``scope["route"]`` / ``scope["endpoint"]`` keys (read by nothing in the proxy).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

LEAN_PATHS = ("/v1/chat/completions", "/v1/messages")
"""The routes served by the lean path (``POST`` only)."""

Endpoint = Callable[[Request], Awaitable[Response]]


def endpoint_app(endpoint: Endpoint) -> ASGIApp:
    """An ASGI app calling ``endpoint(request)`` and sending the response it returns."""
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)
    return app


def app_handlers(app: FastAPI) -> dict[Any, Any]:
    """The exception handlers FastAPI gives its ExceptionMiddleware: every one of ``app``'s but
    the ``Exception`` / 500 handler (that one sits in the outer server-error middleware)."""
    return {k: v for k, v in app.exception_handlers.items() if k not in (500, Exception)}


class LeanRoutes:
    """ASGI middleware: :data:`LEAN_PATHS` served by their endpoints directly (module
    docstring). ``fastapi_app``: the app whose routes and handlers it reads, on first use
    (every route is installed by then)."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI,
                 paths: tuple[str, ...] = LEAN_PATHS) -> None:
        self.app = app
        self._fastapi = fastapi_app
        self._paths = paths
        self._table: dict[str, ASGIApp] | None = None

    def table(self) -> dict[str, ASGIApp]:
        """``{path: ASGI app}`` for the lean routes (built once)."""
        if self._table is None:
            handlers = app_handlers(self._fastapi)
            table: dict[str, ASGIApp] = {}
            for route in self._fastapi.router.routes:
                if (isinstance(route, APIRoute) and route.path in self._paths
                        and "POST" in route.methods and route.path not in table
                        and not route.dependant.dependencies):  # a dependency: full stack
                    table[route.path] = ExceptionMiddleware(
                        endpoint_app(route.endpoint), handlers=handlers,
                        debug=self._fastapi.debug)
            self._table = table
        return self._table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            lean = self.table().get(scope["path"])
            if lean is not None:
                await lean(scope, receive, send)
                return
        await self.app(scope, receive, send)
