"""``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}`` (and the same without ``/v1``).

A request's path (the chat path's steps, :mod:`prefixgate.proxy.app`, in the Responses API's words)::

    auth    proxy.auth              proxy key, rate limits                         (401 / 429)
    parse   proxy.limits / wire     body once, nesting, model / input / stream    (400/408/413)
    route   proxy.router            policy route -> backend; default output cap   (404)
    then, by the backend's kind:
      openai       passthrough to ``base_url/responses``: the rewrite passes that map back onto
                   a Responses body (tools canonicalised, ``prompt_cache_key``), see
                   :func:`_passthrough_passes`; the answer relayed untouched
      other kinds  bridged (:mod:`prefixgate.proxy.bridges.responses_chat`): the chain of
      ``previous_response_id``
                   from the store + the new input -> a Chat Completions body -> the rewrite
                   passes -> (Anthropic backends: the O->A bridge on top) -> the answer, mapped
                   back to a ``response`` object or Responses stream events
                   (:mod:`prefixgate.proxy.bridges.responses_chat_stream`), stored unless ``store: false``
    record  cache.ledger            one row per request (endpoint ``/v1/responses``)

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
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger import LedgerRow
from prefixgate.cache.responses_store import MemoryResponseStore, ResponseStore, StoredResponse
from prefixgate.proxy.api.passthrough import SideCall
from prefixgate.proxy.bridges import translate
from prefixgate.proxy.bridges.openai_anthropic import ChunkMapper
from prefixgate.proxy.bridges.responses_chat import (
    input_items,
    new_id,
    output_from_chat,
    response_object,
    to_chat,
    usage_object,
)
from prefixgate.proxy.bridges.responses_chat_stream import ResponsesStream
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import (
    InvalidRequest,
    ProxyError,
    UnknownEndpoint,
    UpstreamUnavailable,
    error_response,
)
from prefixgate.proxy.core.sse import EventMapper, SSEEvent, parse_event
from prefixgate.proxy.core.usage import AnthropicStreamWatcher, OpenAIStreamWatcher, Usage, usage_from_answer
from prefixgate.proxy.http.headers import downstream_headers, upstream_headers
from prefixgate.proxy.http.tenants import namespaced_session, salted_body, tenant_for
from prefixgate.proxy.pipeline.output_cap import with_default_cap
from prefixgate.proxy.pipeline.rewrite import (
    rewrite_off_loop,
    rewrite_wanted,
    session_hash,
    session_id_for,
)
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.relay import SSE_HEADERS, SSEResponse, StreamRelay
from prefixgate.rewriter.types import Context

log = logging.getLogger("prefixgate.responses")
JSON = "application/json"
MAX_OUTPUT_TOKENS = 2**31 - 1
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


class ResponseNotFound(ProxyError):
    """No stored response with this id (never stored, ``store: false``, expired, deleted)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


def responses_usage(u: Any) -> Usage:
    """A Responses ``usage`` object -> :class:`~prefixgate.proxy.core.usage.Usage`."""
    u = u if isinstance(u, dict) else {}
    num: Callable[[Any], int | None] = lambda v: v if isinstance(v, int) else None  # noqa: E731
    return Usage(prompt_tokens=num(u.get("input_tokens")),
                 cached_tokens=num((u.get("input_tokens_details") or {}).get("cached_tokens")),
                 output_tokens=num(u.get("output_tokens")))


class ResponsesWatcher:
    """:class:`~prefixgate.proxy.core.usage.StreamWatcher` of a passthrough Responses stream: content
    events,
    the terminal event (``response.completed`` / ``incomplete``; its usage) and errors."""

    def __init__(self) -> None:
        self.usage, self.deltas, self.done, self.errors = Usage(), 0, 0, 0
        self.response_id = ""
        self.last_seq = -1  # the highest sequence_number seen

    def observe(self, ev: SSEEvent) -> bool:
        """True for an event carrying output (text, arguments, reasoning)."""
        try:
            obj = orjson.loads(ev.data or "null")
        except orjson.JSONDecodeError:
            return False
        kind = obj.get("type", ev.event) if isinstance(obj, dict) else ev.event
        seq = obj.get("sequence_number") if isinstance(obj, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            self.last_seq = max(self.last_seq, seq)
        if kind in ("response.completed", "response.incomplete"):
            self.done += 1
            self.usage.merge(responses_usage((obj.get("response") or {}).get("usage")))
        elif kind in ("response.failed", "error"):
            self.errors += 1
        elif kind == "response.created":
            self.response_id = str((obj.get("response") or {}).get("id", ""))
        if isinstance(kind, str) and kind.endswith(".delta"):
            self.deltas += 1
            return True
        return False


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


class ResponsesEndpoint:
    """The handlers, bound to the app's :class:`~prefixgate.proxy.app.ProxyState` and a store."""

    def __init__(self, state: Any, store: ResponseStore) -> None:
        self.state, self.store = state, store

    # ---- POST ---------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        """``POST /v1/responses`` (module docstring)."""
        policy = self.state.policy
        call = SideCall(self.state, request, "openai", LedgerRow(endpoint=request.url.path))
        items: list[dict[str, Any]] | None = None
        try:
            await call.read()
            check_body(call.body)
            target, row = call.target, call.row
            assert target is not None
            body, raw = with_default_cap(call.body, call.raw, "responses", target, policy)
            session = namespaced_session(row.tenant, session_id_for(request.headers, body))
            row.session = session_hash(session)
            if target.backend.kind == "openai":
                prev = body.get("previous_response_id")
                if prev and row.tenant and self._owned(prev, row.tenant) is None:
                    raise ResponseNotFound(f"Previous response with id '{prev}' not found.",
                                           param="previous_response_id",
                                           code="previous_response_not_found")
                up_raw = await self._passthrough_passes(request, body, raw, target, row, session)
                url = target.backend.base_url + "/responses"
            else:
                chat, items = self._bridge_body(body, row.tenant)
                up_raw = await self._chat_passes(request, chat, target, row, session)
                url = target.url()
            resp = await call.send(url, up_raw)
        except BaseException as e:
            return call.refuse(e)
        try:
            if resp.status_code >= 400:
                return await call.error(resp)
            if row.stream:
                return self._stream(call, resp, body, items)
            return await self._json(call, resp, body, items)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            raise

    def _bridge_body(self, body: dict[str, Any], tenant: str
                     ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(Chat Completions body, the input items incl. history) for a bridged backend;
        ``previous_response_id`` must name a response of ``tenant`` (else 404)."""
        history: list[dict[str, Any]] = []
        prev = body.get("previous_response_id")
        if prev:
            rec = self._owned(prev, tenant)
            if rec is None or rec.response is None:
                raise ResponseNotFound(f"Previous response with id '{prev}' not found.",
                                       param="previous_response_id",
                                       code="previous_response_not_found")
            history = rec.history()
        return to_chat(body, history), history + input_items(body)

    async def _chat_passes(self, request: Request, chat: dict[str, Any], target: Target,
                           row: LedgerRow, session: str) -> bytes:
        """The rewrite passes on the bridged Chat body, then (Anthropic) the O->A bridge. The
        passes' session-memory updates are merged as the request goes out."""
        depth = self.state.policy.limits.max_json_depth
        rw = await rewrite_off_loop(self.state.rewrite_fn, chat, exactjson.dumps(chat), "openai",
                                    await self._ctx(request, row, target, session))
        row.rewrite, row.edits, row.tokens_pruned = rw.summary not in ("off",), rw.summary, rw.pruned
        if rw.memory:
            try:
                await self.state.sessions.amerge(session, rw.memory)
            except Exception:
                log.exception("session memory merge failed")
        if target.wire == "anthropic":
            return translate.encode("openai", rw.body, depth)
        return salted_body(rw.raw, row.tenant, target.backend)  # the tenant's cache namespace

    async def _passthrough_passes(self, request: Request, body: dict[str, Any], raw: bytes,
                                  target: Target, row: LedgerRow, session: str) -> bytes:
        """The passes that map back onto a Responses body: the pipeline runs on a Chat view
        (``instructions`` as system, the tools) and its ``tools`` (canonical order and schema
        key order) and ``prompt_cache_key`` / ``prompt_cache_retention`` are written back.
        Input items go as the client sent them (hoisting inside ``input`` is not done here)."""
        ctx = await self._ctx(request, row, target, session)
        tools = body.get("tools")
        if ctx is None or not (isinstance(tools, list) or body.get("instructions")):
            row.edits = "off" if ctx is None else "none"
            return raw
        view: dict[str, Any] = {"model": body["model"], "messages": [
            {"role": "system", "content": str(body.get("instructions") or "")},
            {"role": "user", "content": "."}]}
        fn_tools = [t for t in tools or [] if isinstance(t, dict) and t.get("type") == "function"]
        if fn_tools and len(fn_tools) == len(tools or []):
            view["tools"] = [{"type": "function", "function": {k: v for k, v in t.items()
                                                               if k != "type"}} for t in fn_tools]
        rw = await rewrite_off_loop(self.state.rewrite_fn, view, exactjson.dumps(view), "openai",
                                    ctx)
        out = dict(body)
        if "tools" in view and rw.body.get("tools") is not None:
            out["tools"] = [{"type": "function", **t["function"]} for t in rw.body["tools"]]
        for key in ("prompt_cache_key", "prompt_cache_retention"):
            if key in rw.body and key not in body:
                out[key] = rw.body[key]
        row.rewrite, row.edits = True, rw.summary
        return raw if out == body else exactjson.dumps(out)

    async def _ctx(self, request: Request, row: LedgerRow, target: Target, session: str
                   ) -> Context | None:
        policy = self.state.policy
        if not rewrite_wanted(request.headers, policy.rewrite):
            return None
        return Context(settings=policy.rewrite, model=row.model, provider=target.provider,
                       session_id=session, session=await self.state.sessions.aget(session),
                       now_s=time.time())

    # ---- answer -----------------------------------------------------------------------

    async def _json(self, call: SideCall, resp: httpx.Response, body: dict[str, Any],
                    items: list[dict[str, Any]] | None) -> Response:
        """A non-streamed answer: passed through (the id kept as a pointer), or the Chat /
        Anthropic answer as a ``response`` object (stored with its items)."""
        target, row = call.target, call.row
        assert target is not None
        try:
            content = await resp.aread()
            answer = exactjson.loads(content)
            if not isinstance(answer, dict):
                raise TypeError("answer is not a JSON object")
            if items is None:  # passthrough
                usage = responses_usage(answer.get("usage"))
                if body.get("store", True) and isinstance(answer.get("id"), str):
                    self.store.put(StoredResponse(answer["id"], target.backend_name,
                                                  tenant=row.tenant))
            else:
                usage = usage_from_answer(answer, target.wire)
                if target.wire == "anthropic":
                    answer = translate.response("openai", answer, row.model)
                output, status = output_from_chat(answer)
                final = response_object(body, new_id("resp"), int(time.time()), output,
                                        usage_object(answer.get("usage")), status)
                self._keep(body, final, items, target, row.tenant)
                content = exactjson.dumps(final)
        except (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError) as e:
            row.error = type(e).__name__
            response = error_response(UpstreamUnavailable(
                f"upstream {target.backend_name!r} broke off or sent an unreadable answer"),
                "openai")
            call.record(Usage(), "upstream_error", response.status_code)
            return response
        finally:
            await resp.aclose()
        call.timing.end = time.perf_counter()
        call.record(usage, "ok", resp.status_code)
        return Response(content, status_code=resp.status_code, media_type=JSON,
                        headers=_ours(call, resp))

    def _stream(self, call: SideCall, resp: httpx.Response, body: dict[str, Any],
                items: list[dict[str, Any]] | None) -> Response:
        """A stream: passthrough relayed as is, or Chat chunks (Anthropic events through the
        O->A mapper first) mapped to Responses events."""
        target, row = call.target, call.row
        assert target is not None
        mapper: EventMapper | None = None
        if items is None:
            watcher: Any = ResponsesWatcher()
        else:
            watcher = AnthropicStreamWatcher() if target.wire == "anthropic" else (
                OpenAIStreamWatcher())
            stream = ResponsesStream(body, new_id("resp"),
                                     on_done=lambda r: self._keep(body, r, items, target,
                                                                  row.tenant))
            mapper = stream.map
            if target.wire == "anthropic":
                mapper = _chained(ChunkMapper(row.model, watcher, True).map, stream.map)

        async def on_end(status: str, http_status: int) -> None:
            if items is None and status == "ok" and body.get("store", True) and \
                    watcher.response_id:
                self.store.put(StoredResponse(watcher.response_id, target.backend_name,
                                              tenant=row.tenant))
            call.record(watcher.usage, status, http_status, watcher.deltas)

        relay = StreamRelay(resp, watcher, call.timing, on_end, mapper, "openai",
                            end_mapper=_error_event(watcher) if items is None else stream.map)
        return SSEResponse(relay, headers={**_ours(call, resp), **SSE_HEADERS})

    def _keep(self, body: dict[str, Any], final: dict[str, Any],
              items: list[dict[str, Any]] | None, target: Target, tenant: str) -> None:
        if body.get("store", True) is not False and items is not None:
            self.store.put(StoredResponse(final["id"], target.backend_name, final, items,
                                          tenant))

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
            return await self._forward(request, backend, response_id, method)
        except ProxyError as e:
            return error_response(e, "openai")

    def _only_openai_backend(self) -> str | None:
        names = [n for n, b in self.state.policy.backends.items() if b.kind == "openai"]
        return names[0] if len(names) == 1 else None

    async def _forward(self, request: Request, name: str, response_id: str,
                       method: str) -> Response:
        backend = self.state.policy.backends[name]
        target = Target("", name, backend, "openai", "openai", False)
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


def _ours(call: SideCall, resp: httpx.Response) -> dict[str, str]:
    """The upstream's headers the client gets, and the rewrite summary (``x-prefixgate-edits``,
    ``x-prefixgate-tokens-pruned``) as on the chat endpoints."""
    return {**downstream_headers(resp.headers), "x-prefixgate-edits": call.row.edits or "off",
            "x-prefixgate-tokens-pruned": str(call.row.tokens_pruned)}


def _error_event(watcher: ResponsesWatcher) -> Callable[[bytes, SSEEvent], list[bytes]]:
    """The relay's own closing error (Chat-shaped ``data: {"error": {...}}``) as a Responses
    stream ``error`` event (``type``, ``code``, ``message``, ``param``, ``sequence_number``
    following the upstream's last), for a passthrough Responses stream."""
    def end(raw: bytes, ev: SSEEvent) -> list[bytes]:
        err = orjson.loads(ev.data or "{}").get("error") or {}
        obj = {"type": "error", "code": err.get("code"), "message": err.get("message", ""),
               "param": err.get("param"), "sequence_number": watcher.last_seq + 1}
        return [b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"]
    return end


def _chained(first: Callable[[bytes, SSEEvent], list[bytes]],
             second: Callable[[bytes, SSEEvent], list[bytes]]
             ) -> Callable[[bytes, SSEEvent], list[bytes]]:
    """Two stream mappers in a row (Anthropic events -> Chat chunks -> Responses events)."""
    def both(raw: bytes, ev: SSEEvent) -> list[bytes]:
        return [out for mid in first(raw, ev) for out in second(mid, parse_event(mid))]
    return both


async def _no_such_endpoint(request: Request, response_id: str) -> Response:
    """``POST /v1/responses/compact`` and the like: 404 in OpenAI's shape (not served here)."""
    return error_response(UnknownEndpoint(request.method, request.url.path, 404), "openai")


def install(app: FastAPI, state: Any, store: ResponseStore | None = None) -> ResponseStore:
    """Add the Responses routes to ``app`` (served without ``/v1`` too, by
    :class:`prefixgate.proxy.http.middleware.BarePaths`); return the store (default: a
    :class:`MemoryResponseStore`)."""
    store = store if store is not None else MemoryResponseStore()
    ep = ResponsesEndpoint(state, store)
    app.add_api_route("/v1/responses", ep.create, methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", ep.retrieve, methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", ep.delete, methods=["DELETE"])
    app.add_api_route("/v1/responses/{response_id}", _no_such_endpoint, methods=["POST"],
                      include_in_schema=False)
    app.state.responses = store
    return store
