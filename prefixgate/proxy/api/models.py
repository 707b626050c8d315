"""``GET /v1/models`` and ``GET /v1/models/{id}`` (HEAD too): the models a client can call.

:func:`list_models` shows exactly the model names a client can call — every alias, every route
glob without wildcards, and each model a local / OpenAI-compatible backend lists (asked live,
2 s) when a route would send that name there. A key is needed where the proxy has keys (401),
and both routes count against the key's rate limit like any other request (429, issue 20).

A backend's live listing is reused for :data:`LISTING_TTL_S` seconds (:class:`Listings`): one
ask per backend per 10 s however many clients call, one at a time (concurrent callers wait for
the ask in flight), a failed ask remembered as "nothing listed" for the same time. Bounded: one
entry per policy backend, at most :data:`MAX_LISTED` models each.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Policy
from prefixgate.proxy.core.errors import ProxyError, error_response
from prefixgate.proxy.pipeline.exchange import ProxyState
from prefixgate.proxy.routing.router import find_route, pick_target

LISTING_TTL_S = 10.0
"""Seconds a backend's live model listing is reused."""
MAX_LISTED = 4096
"""Models kept from one backend's listing (the rest are not shown)."""


async def _ask(client: httpx.AsyncClient, policy: Policy, name: str) -> list[Any]:
    """The ``data`` list of the first deployment of backend ``name`` that answers (2 s each);
    ``[]`` when none does or the answer has the wrong shape."""
    for d in policy.backends[name].group(name):
        try:
            listed = (await client.get(d.base_url + "/models", timeout=2.0)).json().get("data")
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        return listed[:MAX_LISTED] if isinstance(listed, list) else []
    return []


class Listings:
    """Live model listings per backend, reused for ``ttl_s`` seconds (module docstring).
    ``clock``: monotonic seconds (tests)."""

    def __init__(self, ttl_s: float = LISTING_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._held: dict[str, tuple[float, list[Any]]] = {}  # backend -> (expires, data)
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, client: httpx.AsyncClient, policy: Policy, name: str) -> list[Any]:
        """Backend ``name``'s listing: the one held while fresh, else asked now (one ask in
        flight per backend)."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            held = self._held.get(name)
            if held is not None and self.clock() < held[0]:
                return held[1]
            data = await _ask(client, policy, name)
            self._held[name] = (self.clock() + self.ttl_s, data)
            return data


async def list_models(client: httpx.AsyncClient | None, policy: Policy,
                      listings: Listings | None = None) -> dict[str, Any]:
    """OpenAI ``{"object": "list", "data": [{"id", "object": "model", "owned_by"}]}`` (see
    module docstring). ``listings``: where live listings are reused (None: asked now)."""
    seen: dict[str, str] = {}
    for alias, real in policy.aliases.items():
        route = find_route(policy, real)
        if route is not None:
            seen.setdefault(alias, route.chain()[0].backend)
    for route in policy.routes:
        if not any(c in route.match for c in "*?["):
            seen.setdefault(route.match, route.chain()[0].backend)
    for name, b in policy.backends.items():
        if not traits(b.kind).lists_models or client is None:
            continue
        listed = await (listings.get(client, policy, name) if listings is not None
                        else _ask(client, policy, name))
        for m in listed:  # a wrong shape added nothing
            if not (isinstance(m, dict) and isinstance(m.get("id"), str)):
                continue
            route = find_route(policy, m["id"])
            if route is not None and m["id"] not in policy.aliases and (
                    route.chain()[0].backend == name) and fnmatch.fnmatchcase(m["id"],
                                                                             route.match):
                seen.setdefault(m["id"], name)
    return {"object": "list",
            "data": [{"id": k, "object": "model", "created": 0, "owned_by": v}
                     for k, v in seen.items()]}


async def _model(state: ProxyState, request: Request, model_id: str) -> Response:
    """``GET /v1/models/{id}``: OpenAI's model object when a route matches the id (owned by the
    backend it routes to), else 404 ``model_not_found``."""
    try:
        await state.guard.admit(request.headers, "openai", limit=True)  # 401 without a key, 429 over
        target = pick_target(state.policy, model_id, "openai", can_translate=True)
    except ProxyError as e:
        return error_response(e, "openai")
    return JSONResponse({"id": model_id, "object": "model", "created": 0,
                         "owned_by": target.backend_name})


def install(app: FastAPI, state: ProxyState) -> None:
    """Add the model routes to ``app`` (HEAD: the same handlers, left out of the OpenAPI
    schema: one operation id per route)."""
    listings = Listings()

    @app.get("/v1/models")
    @app.head("/v1/models", include_in_schema=False)
    async def models(request: Request) -> JSONResponse:
        await state.guard.admit(request.headers, "openai", limit=True)  # 401 without a key, 429 over
        return JSONResponse(await list_models(state.side, state.policy, listings))

    async def model(request: Request, model_id: str) -> Response:
        return await _model(state, request, model_id)

    app.add_api_route("/v1/models/{model_id:path}", model, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", model, methods=["HEAD"],
                      include_in_schema=False)
