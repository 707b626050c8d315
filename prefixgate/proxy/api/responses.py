"""``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}`` (and the same without ``/v1``).

``POST`` runs the one pipeline (:mod:`prefixgate.proxy.pipeline.run`) like chat — auth, rate
limits, tenant, body, route, default output cap (``max_output_tokens``), the passes, deployments,
breakers, retries, fallbacks, the fan-out gate, one ledger row with usage and cost. Only the
bridge differs, by the backend's kind (:mod:`prefixgate.config.backend_kinds`, ``native_responses``):

- a backend that serves ``/responses`` itself (``openai``): the Responses identity bridge
  (:mod:`prefixgate.proxy.bridges.responses_identity`): the passes that map back onto a Responses
  body (tools canonicalised, ``prompt_cache_key``); the answer relayed untouched, its id kept as
  a pointer to that backend;
- any other: Responses -> Chat (:mod:`prefixgate.proxy.bridges.responses_chat`): the chain of
  ``previous_response_id`` from the store + the new input -> a Chat Completions body -> the
  rewrite passes -> (Anthropic backends: the O->A bridge on top) -> the answer, mapped back to a
  ``response`` object or Responses stream events, stored unless ``store: false``.

Errors are OpenAI-shaped (``{"error": {...}}``); an unknown ``previous_response_id`` is a 404
``previous_response_not_found``, an unknown id on GET / DELETE a 404 ``not_found``.

Tenants (:mod:`prefixgate.proxy.http.tenants`): as on the chat path, the session id is namespaced by
the tenant and a bridged body carries the tenant's ``cache_salt`` (backends that take one).
A stored response belongs to the tenant that created it. Another tenant's id reads exactly
as an unknown one (404, on GET, DELETE and as ``previous_response_id``), and with a tenant an
id not in the store is never forwarded to an OpenAI backend (the backend's one key cannot tell
tenants apart). An id that is not ``[A-Za-z0-9_-]{1,200}`` is a 404 and never reaches a
backend's URL (no ``..``, ``/``, ``?``).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.cache.state.responses_store import MemoryResponseStore, ResponseStore, StoredResponse
from prefixgate.config.backend_kinds import traits
from prefixgate.config.secrets import MissingSecret, resolve_secret
from prefixgate.proxy.bridges import Bridge, ResponsesState, bridge_for
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import (
    InvalidRequest,
    ProxyError,
    UnknownEndpoint,
    UpstreamUnavailable,
    error_response,
)
from prefixgate.proxy.http.headers import downstream_headers, upstream_headers
from prefixgate.proxy.http.tenants import tenant_for
from prefixgate.proxy.pipeline.endpoint import Endpoint
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.run import run
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import JSON

log = logging.getLogger("prefixgate.responses")
MAX_OUTPUT_TOKENS = 2**31 - 1
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


class ResponseNotFound(ProxyError):
    """No stored response with this id (never stored, ``store: false``, expired, deleted)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


def check_body(body: dict[str, Any]) -> None:
    """What the proxy relies on: ``model`` string, ``input`` present (string or array),
    ``stream`` / ``store`` booleans, ``max_output_tokens`` an integer in 1..2**31-1 (it is
    echoed in the response object; a huge one cannot be encoded), ``previous_response_id``
    string. InvalidRequest (400)."""
    if not isinstance(body.get("model"), str):
        raise InvalidRequest("Missing required parameter: 'model'." if "model" not in body else
                             "Invalid type for 'model': expected a string.", param="model",
                             code="missing_required_parameter" if "model" not in body
                             else "invalid_type")
    if not isinstance(body.get("input"), (str, list)):
        raise InvalidRequest("'input' must be a string or an array of input items.",
                             param="input", code="invalid_type")
    for key in ("stream", "store"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise InvalidRequest(f"Invalid type for '{key}': expected a boolean.", param=key,
                                 code="invalid_type")
    cap = body.get("max_output_tokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool)
                            or not 0 < cap <= MAX_OUTPUT_TOKENS):
        raise InvalidRequest(f"Invalid 'max_output_tokens': expected an integer from 1 to "
                             f"{MAX_OUTPUT_TOKENS}.", param="max_output_tokens",
                             code="invalid_value")
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise InvalidRequest("Invalid type for 'previous_response_id': expected a string.",
                             param="previous_response_id", code="invalid_type")


RESPONSES = Endpoint(api="openai", client="responses", path="/responses", check=check_body,
                     cap="responses", analyze=False)


class ResponsesEndpoint:
    """The handlers, bound to the app's :class:`~prefixgate.proxy.pipeline.exchange.ProxyState` and a
    store."""

    def __init__(self, state: ProxyState, store: ResponseStore) -> None:
        self.state, self.store = state, store

    # ---- POST ---------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        """``POST /v1/responses`` (module docstring)."""
        ex = Exchange(RESPONSES, LedgerRow(endpoint=request.url.path))
        ex.bridge_of = self._bridge  # called with ex: a closure over ex would be a cycle
        return await run(self.state, request, ex)

    def _bridge(self, ex: Exchange, target: Target) -> Bridge:
        """The bridge of ``target`` for this request: the Responses identity on a backend that
        serves the API itself, else Responses -> Chat over the ``previous_response_id`` chain
        (404 ``previous_response_not_found`` for an id that is not the tenant's)."""
        body, tenant = ex.body, ex.row.tenant
        prev = body.get("previous_response_id")
        store = body.get("store", True) is not False
        if traits(target.backend.kind).native_responses:
            if prev and tenant and self._owned(prev, tenant) is None:
                raise _prev_not_found(prev)
            pointer = (lambda rid: self.store.put(StoredResponse(rid, target.backend_name,
                                                                 tenant=tenant))) if store else None
            return bridge_for("responses", "responses", responses=ResponsesState(body, keep_pointer=pointer))
        history: list[dict[str, Any]] = []
        if prev:
            rec = self._owned(prev, tenant)
            if rec is None or rec.response is None:
                raise _prev_not_found(prev)
            history = rec.history()

        def keep(rid: str, final: dict[str, Any], items: list[dict[str, Any]]) -> None:
            self.store.put(StoredResponse(rid, target.backend_name, final, items, tenant))
        return bridge_for("responses", target.wire,
                          responses=ResponsesState(body, history, keep if store else None))

    def _owned(self, response_id: str, tenant: str) -> StoredResponse | None:
        """The stored response if it is ``tenant``'s (another tenant's reads as absent)."""
        rec = self.store.get(response_id) if _ID_RE.match(response_id) else None
        return rec if rec is not None and rec.tenant == tenant else None

    # ---- GET / DELETE -------------------------------------------------------------------

    async def retrieve(self, request: Request, response_id: str) -> Response:
        """``GET /v1/responses/{id}``: the stored response, or the OpenAI backend's."""
        return await self._by_id(request, response_id, "GET")

    async def delete(self, request: Request, response_id: str) -> Response:
        """``DELETE /v1/responses/{id}``: ``{"id", "object": "response.deleted", "deleted":
        true}``; forwarded too when the response lives at an OpenAI backend."""
        return await self._by_id(request, response_id, "DELETE")

    async def _by_id(self, request: Request, response_id: str, method: str) -> Response:
        try:
            key_id = await self.state.guard.admit(request.headers, "openai", limit=False)
            tenant = tenant_for(request.headers, key_id, self.state.policy, self.state.guard)
            rec = self._owned(response_id, tenant)
            if rec is not None and rec.response is not None:
                if method == "DELETE":
                    self.store.delete(response_id)
                    return JSONResponse({"id": response_id, "object": "response.deleted",
                                         "deleted": True})
                return Response(exactjson.dumps(rec.response), media_type=JSON)
            backend = rec.backend if rec is not None else (
                None if tenant or not _ID_RE.match(response_id) else self._only_openai_backend())
            if backend is None:
                raise ResponseNotFound(f"No response found with id '{response_id}'.",
                                       param="response_id")
            if method == "DELETE":
                self.store.delete(response_id)
            return await self._forward(request, backend, response_id, method, tenant)
        except ProxyError as e:
            return error_response(e, "openai")

    def _only_openai_backend(self) -> str | None:
        """The one backend serving the Responses API itself that an unknown id may live at; None
        when there is not exactly one, or when its key is not set (the proxy cannot ask it,
        and nothing created through this proxy can be there: 404, not a 424, issue 22 item 3)."""
        names = [n for n, b in self.state.policy.backends.items()
                 if traits(b.kind).native_responses]
        if len(names) != 1:
            return None
        backend = self.state.policy.backends[names[0]]
        try:
            resolve_secret(backend.api_key)
        except MissingSecret:
            return None
        return names[0]

    async def _forward(self, request: Request, name: str, response_id: str,
                       method: str, tenant: str) -> Response:
        backend = self.state.policy.backends[name]
        target = Target("", name, backend, "openai", "openai", False, tenant=tenant)
        headers = upstream_headers(request.headers.items(), backend, target.api_key())
        client = self.state.upstream.client
        if client is None:
            raise UpstreamUnavailable("the upstream client is not running")
        try:
            resp = await client.request(method, f"{backend.base_url}/responses/{response_id}",
                                        headers=headers, timeout=backend.timeout_s)
        except httpx.HTTPError as e:
            raise UpstreamUnavailable(f"upstream {name!r} unreachable ({type(e).__name__})"
                                      ) from None
        return Response(resp.content, status_code=resp.status_code, media_type=JSON,
                        headers=downstream_headers(resp.headers))


def _prev_not_found(prev: str) -> ResponseNotFound:
    return ResponseNotFound(f"Previous response with id '{prev}' not found.",
                            param="previous_response_id", code="previous_response_not_found")


async def _no_such_endpoint(request: Request, response_id: str) -> Response:
    """``POST /v1/responses/compact`` and the like: 404 in OpenAI's shape (not served here)."""
    return error_response(UnknownEndpoint(request.method, request.url.path, 404), "openai")


def install(app: FastAPI, state: ProxyState, store: ResponseStore | None = None) -> ResponseStore:
    """Add the Responses routes to ``app`` (served without ``/v1`` too, by
    :class:`prefixgate.proxy.http.middleware.BarePaths`); return the store (default: a
    :class:`MemoryResponseStore` held as exact-number JSON bytes)."""
    store = store if store is not None else MemoryResponseStore(dumps=exactjson.dumps,
                                                                loads=exactjson.loads)
    ep = ResponsesEndpoint(state, store)
    app.add_api_route("/v1/responses", ep.create, methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", ep.retrieve, methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", ep.delete, methods=["DELETE"])
    app.add_api_route("/v1/responses/{response_id}", _no_such_endpoint, methods=["POST"],
                      include_in_schema=False)
    app.state.responses = store
    return store
