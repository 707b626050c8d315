"""The savings dashboard: ``GET /dashboard`` and its static files (issue 9, item 5).

One self-contained page (``prefixgate/proxy/observe/static/dashboard.html`` + ``dashboard.js`` +
``dashboard.css``) that draws ``GET /api/savings?range=1h|24h|7d`` (the JSON contract of
:mod:`prefixgate.proxy.observe.savings_api`) with uPlot, vendored from npm (``uplot`` 1.6.32, MIT,
its LICENSE next to it under ``prefixgate/proxy/observe/static/uplot/``). No CDN, no build step:
everything the page loads comes from this module, :data:`STATIC` names every file, and the page +
scripts + styles stay under :data:`PAGE_BUDGET_BYTES` (tested).

Auth: with proxy keys configured (:mod:`prefixgate.proxy.http.auth`) the page and its files need a key like
any model endpoint. A browser cannot attach ``Authorization: Bearer`` to a page load, so the standard
HTTP Basic scheme is accepted too (:func:`prefixgate.proxy.http.auth.presented_key`): without a valid key the
answer is 401 with ``WWW-Authenticate: Basic realm="prefixgate"``, the browser asks for a user
name and password, and the proxy key goes in the **password** field (any user name). The browser
then resends it on the page's own ``fetch('/api/savings')`` (same origin), so the key never
appears in a URL or an access log line. From a script: ``curl -u :pgk-... URL/dashboard`` or
``-H 'Authorization: Bearer pgk-...'``. Without keys (loopback only) the page is open. The page
holds no figures itself: everything it draws comes from ``/api/savings`` with the same key, so
a key sees its own tenant's traffic only and an ``admin`` key every tenant's
(:mod:`prefixgate.proxy.observe.savings_api`).

Responses carry ``Content-Security-Policy`` (scripts, styles, fetches from this origin only;
no inline script), ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store`` for the
page.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import FastAPI, Request
from starlette.responses import Response

from prefixgate.proxy.core.errors import Unauthorized, UnknownEndpoint, error_response
from prefixgate.proxy.http.auth import Guard

PAGE_BUDGET_BYTES = 150 * 1024  # issue 9: page + scripts <= 150 KB

# URL name under /dashboard/static/ -> (path under prefixgate/proxy/observe/static/, media type)
STATIC: dict[str, tuple[str, str]] = {
    "dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "uPlot.iife.min.js": ("uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "uPlot.min.css": ("uplot/uPlot.min.css", "text/css; charset=utf-8"),
    "uPlot.LICENSE.txt": ("uplot/LICENSE", "text/plain; charset=utf-8"),
}
PAGE = "dashboard.html"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer"}
CHALLENGE = {"www-authenticate": 'Basic realm="prefixgate", charset="UTF-8"'}


@cache
def asset(relpath: str) -> bytes:
    """The bytes of ``prefixgate/proxy/observe/static/<relpath>`` (read once, from the installed package).
    Raises FileNotFoundError when the package was installed without its package data."""
    return resources.files(__package__ or "prefixgate.proxy").joinpath("static", relpath).read_bytes()


def page_bytes() -> int:
    """Bytes a browser loads for the page: the HTML plus every script and style it references
    (the uPlot LICENSE is served but not loaded)."""
    return len(asset(PAGE)) + sum(len(asset(path)) for name, (path, _) in STATIC.items()
                                  if not name.endswith(".txt"))


async def _admit(guard: Guard, request: Request) -> Response | None:
    """None when the request may see the dashboard; else the 401 to send, with the Basic
    challenge so a browser asks for the key. Rate limits are not counted (a page view is not a
    model request)."""
    try:
        await guard.admit(request.headers, "openai", limit=False)
    except Unauthorized as e:
        return error_response(e, "openai", CHALLENGE)
    return None


def install(app: FastAPI, guard: Guard) -> None:
    """Add ``GET|HEAD /dashboard`` (the page) and ``GET|HEAD /dashboard/static/{name}`` (the
    files in :data:`STATIC`; any other name is a 404 in the OpenAI error shape) to ``app``,
    behind ``guard``'s proxy keys."""

    @app.get("/dashboard", include_in_schema=False)
    @app.head("/dashboard", include_in_schema=False)
    async def dashboard(request: Request) -> Response:
        refused = await _admit(guard, request)
        if refused is not None:
            return refused
        return Response(asset(PAGE), media_type="text/html; charset=utf-8",
                        headers={**SECURITY_HEADERS, "cache-control": "no-store"})

    @app.get("/dashboard/static/{name}", include_in_schema=False)
    @app.head("/dashboard/static/{name}", include_in_schema=False)
    async def static(name: str, request: Request) -> Response:
        refused = await _admit(guard, request)
        if refused is not None:
            return refused
        if name not in STATIC:
            return error_response(UnknownEndpoint("GET", request.url.path, 404), "openai")
        path, media_type = STATIC[name]
        return Response(asset(path), media_type=media_type,
                        headers={**SECURITY_HEADERS, "cache-control": "private, max-age=300"})
