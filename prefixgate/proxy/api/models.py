"""``GET /v1/models`` and ``GET /v1/models/{id}`` (HEAD too): the models a client can call.

:func:`list_models` shows exactly the model names a client can call — every alias, every route
glob without wildcards, and each model a local / OpenAI-compatible backend lists (asked live,
2 s) when a route would send that name there. A key is needed where the proxy has keys (401).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Policy
from prefixgate.proxy.core.errors import ProxyError, error_response
from prefixgate.proxy.pipeline.exchange import ProxyState
from prefixgate.proxy.routing.router import find_route, pick_target


async def list_models(client: httpx.AsyncClient | None, policy: Policy) -> dict[str, Any]:
    """OpenAI ``{"object": "list", "data": [{"id", "object": "model", "owned_by"}]}`` (see
    module docstring)."""
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
        listed: Any = None
        for d in b.group(name):  # the first deployment that answers
            try:
                listed = (await client.get(d.base_url + "/models", timeout=2.0)).json().get("data")
                break
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
        for m in listed if isinstance(listed, list) else []:  # a wrong shape adds nothing
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
        await state.guard.admit(request.headers, "openai", limit=False)
        target = pick_target(state.policy, model_id, "openai", can_translate=True)
    except ProxyError as e:
        return error_response(e, "openai")
    return JSONResponse({"id": model_id, "object": "model", "created": 0,
                         "owned_by": target.backend_name})


def install(app: FastAPI, state: ProxyState) -> None:
    """Add the model routes to ``app`` (HEAD: the same handlers, left out of the OpenAPI
    schema: one operation id per route)."""
    @app.get("/v1/models")
    @app.head("/v1/models", include_in_schema=False)
    async def models(request: Request) -> JSONResponse:
        await state.guard.admit(request.headers, "openai", limit=False)  # 401 without a key
        return JSONResponse(await list_models(state.side, state.policy))

    async def model(request: Request, model_id: str) -> Response:
        return await _model(state, request, model_id)

    app.add_api_route("/v1/models/{model_id:path}", model, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", model, methods=["HEAD"],
                      include_in_schema=False)
