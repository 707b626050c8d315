"""The proxy's HTTP surface: :func:`build_app` returns the FastAPI app.

A request's path, top to bottom in :func:`_proxy` — each step is a call into the module that owns
it::

    parse    proxy.wire        body read once under max_body_bytes, JSON checked  (400 / 413)
    route    proxy.router      policy route -> backend, provider, upstream URL    (404 / 501)
    passes   proxy.rewriting   session id, opt-out header, rewriter pipeline      (fail-open)
    send     proxy.relay       allowlisted headers + backend key, shared client   (502 / 504)
    relay    proxy.relay       SSE event by event, or the JSON body; TTFT / TPOT timed
    record   cache.ledger      one row per request, metrics, session memory merged,
             proxy.insight     cache breaks + counterfactual cached tokens (after the answer)

Endpoints: ``POST /v1/chat/completions`` (OpenAI), ``POST /v1/messages`` (Anthropic); a client
whose API differs from its backend's goes through a bridge (:mod:`proxy.translate`),
``GET /v1/models``,
``GET /healthz``, ``GET /metrics``; any other path or method is a 404 / 405 in the caller's
shape. Response headers: ``x-prefixgate-edits`` (the rewrite
summary, or ``off``), ``x-prefixgate-tokens-pruned``, and ``x-prefixgate-cached-tokens`` on
non-streamed answers, and on streams whose backend reports cached tokens in its response headers
(our engine's ``X-Engine-Cached-Tokens``); other streams' headers leave before usage is known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from cache.ledger import Ledger, LedgerRow
from cache.session import MemorySessionStore, RedisSessionStore, SessionStore
from config.schema import Policy
from proxy import translate, wire
from proxy.errors import (
    Api,
    InternalError,
    ProxyError,
    UnknownEndpoint,
    UpstreamUnavailable,
    api_for_path,
    error_response,
    upstream_error_body,
)
from proxy.headers import downstream_headers, upstream_headers
from proxy.insight import Analysis, Insight, input_cost_usd
from proxy.metrics import ProxyMetrics
from proxy.openapi_schemas import ANTHROPIC_MESSAGES_REQUEST, OPENAI_CHAT_REQUEST, request_body
from proxy.relay import SSE_HEADERS, SSEResponse, Timing, Upstream, relay_events
from proxy.rewriting import (
    RewriteFn,
    default_rewrite_fn,
    rewrite_wanted,
    run_rewrite,
    session_hash,
    session_id_for,
)
from proxy.router import Target, pick_target
from proxy.usage import (
    AnthropicStreamWatcher,
    OpenAIStreamWatcher,
    Usage,
    usage_from_answer,
    usage_from_headers,
)
from rewriter.types import Context

log = logging.getLogger("prefixgate.proxy")

# Bodies above this (base64 images, B19) skip the break / counterfactual analysis: counting
# tokens of megabytes of base64 costs ~0.25 s per MB and says nothing about the text prefix.
ANALYZE_MAX_BYTES = 1 << 20
JSON = "application/json"


@dataclass
class ProxyState:
    """Everything the handlers share: policy, ledger, session store, rewriter, client."""

    policy: Policy
    ledger: Ledger
    sessions: SessionStore
    rewrite_fn: RewriteFn | None
    upstream: Upstream
    metrics: ProxyMetrics
    insight: Insight | None

    def record(self, row: LedgerRow) -> None:
        """Write the row and count it; never raises (a ledger failure must not fail a request)."""
        try:
            self.ledger.write(row)
            self.metrics.observe(row)
        except Exception:
            log.exception("ledger write failed")
        log.info("%s %s backend=%s status=%s http=%s prompt=%s cached=%s ttft_ms=%s edits=%s",
                 row.endpoint, row.model, row.backend, row.status, row.http_status,
                 row.prompt_tokens, row.cached_tokens,
                 None if row.ttft_ms is None else round(row.ttft_ms, 1), row.edits)


_SENT_AS_IS = ("none", "off", "unavailable")  # edit summaries of bodies sent unchanged


async def _finish(state: ProxyState, row: LedgerRow, timing: Timing, usage: Usage,
                  status: str, memory: dict[str, Any], session_id: str, deltas: int = 0,
                  analyze: Callable[[], Analysis] | None = None) -> None:
    """Fill the row's usage and timing, merge session memory, run the break / counterfactual
    analysis (``analyze``), record. Called once per request."""
    row.status = status
    row.prompt_tokens, row.cached_tokens = usage.prompt_tokens, usage.cached_tokens
    row.cache_write_tokens = usage.cache_write_tokens
    row.output_tokens = usage.output_tokens if usage.output_tokens is not None else (
        deltas if row.stream and deltas else None)
    row.ttft_ms = timing.ttft_ms()
    row.tpot_ms = timing.tpot_ms(row.output_tokens)
    row.total_ms = timing.total_ms()
    if memory:
        try:
            state.sessions.merge(session_id, memory)
        except Exception:
            log.exception("session memory merge failed")
    row.input_usd = input_cost_usd(row.model, row.prompt_tokens, row.cached_tokens,
                                   row.cache_write_tokens)
    if analyze is not None:  # CPU work (token counting): off the event loop
        a = await anyio.to_thread.run_sync(analyze)
        row.cf_cached_tokens, row.cf_input_usd = a.cf_cached_tokens, a.cf_input_usd
        if row.edits in _SENT_AS_IS and row.cached_tokens is not None:
            # the client's own body went upstream: what it would have cached is what it did
            # cache; the model's estimate would only add its error (template tokens, tokenizer)
            row.cf_cached_tokens, row.cf_input_usd = row.cached_tokens, row.input_usd
        if a.brk is not None:
            try:
                state.ledger.write_break(row.session, a.brk)
            except Exception:
                log.exception("break record write failed")
    state.record(row)


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        return False


async def _proxy(state: ProxyState, request: Request, api: Api) -> Response:
    """Serve one model request end to end (see module docstring)."""
    policy, timing = state.policy, Timing()
    row = LedgerRow(endpoint=request.url.path)
    try:
        # 1. parse
        raw = await wire.read_body(request, policy.max_body_bytes)
        body = wire.parse_json(raw)
        (wire.check_anthropic if api == "anthropic" else wire.check_openai)(body)
        row.model, row.stream = body["model"], wire.is_stream(body)
        # 2. route
        target = pick_target(policy, row.model, api, can_translate=True)
        row.route, row.backend = target.route, target.backend_name
        # 3. passes
        session_id = session_id_for(request.headers, body)
        row.session = session_hash(session_id)
        ctx = None
        if rewrite_wanted(request.headers, policy.rewrite):
            ctx = Context(settings=policy.rewrite, model=row.model, provider=target.provider,
                          session_id=session_id, session=state.sessions.get(session_id))
        rw = run_rewrite(state.rewrite_fn, body, raw, api, ctx)
        row.rewrite, row.edits, row.tokens_pruned = ctx is not None, rw.summary, rw.pruned
        up_raw = orjson.dumps(translate.request(api, rw.body)) if target.translate else rw.raw
        # 4. send
        headers = upstream_headers(request.headers.items(), target.backend, target.api_key())
        resp = await state.upstream.send(target.url(), headers, up_raw, target.backend.timeout_s)
    except Exception as e:  # noqa: BLE001 - every failure is answered in the caller's shape
        exc = e if isinstance(e, ProxyError) else InternalError.wrap(e)
        row.status, row.http_status, row.error = type(exc).__name__, exc.status, exc.message[:200]
        row.total_ms = timing.total_ms()
        state.record(row)
        return error_response(exc, api)

    ours = {"x-prefixgate-edits": rw.summary, "x-prefixgate-tokens-pruned": str(rw.pruned)}
    early = usage_from_headers(resp.headers)  # engines that report usage in headers
    if early.cached_tokens is not None:
        ours["x-prefixgate-cached-tokens"] = str(early.cached_tokens)
    row.http_status = resp.status_code
    if resp.status_code >= 400:  # the upstream's own error, passed through with its status
        try:
            err = await resp.aread()
        except httpx.HTTPError:
            err = b""
        finally:
            await resp.aclose()
        media = resp.headers.get("content-type", "application/json")
        if not _is_json_object(err):  # an HTML page, an empty body: put in the caller's shape
            err, media = orjson.dumps(upstream_error_body(err, resp.status_code, api)), JSON
        elif target.translate:
            err, media = orjson.dumps(translate.error(api, err, resp.status_code)), JSON
        row.error = f"upstream {resp.status_code}"
        await _finish(state, row, timing, Usage(), "upstream_error", {}, session_id)
        return Response(err, status_code=resp.status_code, headers=ours, media_type=media)

    def analyze() -> Analysis:
        if state.insight is None or len(raw) > ANALYZE_MAX_BYTES:
            return Analysis()
        return state.insight.observe(session=row.session, backend=target.backend_name,
                                     provider=target.provider, api=api, model=row.model,
                                     original=body, sent=rw.body)

    # 5. relay
    out_headers = {**downstream_headers(resp.headers), **ours}
    ctype = resp.headers.get("content-type", "")
    if row.stream and not ctype.startswith("text/event-stream"):
        await resp.aclose()  # a plain body where SSE was asked for: not relayable as a stream
        row.error = "not an SSE stream"
        await _finish(state, row, timing, Usage(), "upstream_error", {}, session_id)
        return error_response(UpstreamUnavailable(
            f"upstream {target.backend_name!r} answered a streamed request with "
            f"{ctype.split(';')[0] or 'no content type'} instead of an event stream"), api)
    if row.stream:
        watcher = AnthropicStreamWatcher() if target.wire == "anthropic" else OpenAIStreamWatcher()
        watcher.usage.merge(early)
        mapper = translate.mapper(api, row.model, watcher, body) if target.translate else None

        async def on_end(status: str) -> None:
            await _finish(state, row, timing, watcher.usage, status, rw.memory, session_id,
                          watcher.deltas, analyze)

        return SSEResponse(relay_events(resp, watcher, timing, on_end, mapper, api),
                           headers={**out_headers, **SSE_HEADERS})
    try:
        content = await resp.aread()
        answer = orjson.loads(content)
        if not isinstance(answer, dict):
            raise TypeError("answer is not a JSON object")
        usage = early
        usage.merge(usage_from_answer(answer, target.wire))
        if target.translate:
            content = orjson.dumps(translate.response(api, answer, row.model))
    except (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        # the body broke off, is not a JSON object, or has a shape the bridge cannot translate
        row.error = type(e).__name__
        await _finish(state, row, timing, Usage(), "upstream_error", {}, session_id)
        return error_response(UpstreamUnavailable(
            f"upstream {target.backend_name!r} broke off or sent an unreadable answer"), api)
    finally:
        await resp.aclose()
    timing.end = time.perf_counter()
    # 6. record
    await _finish(state, row, timing, usage, "ok", rw.memory, session_id, analyze=analyze)
    if usage.cached_tokens is not None:
        out_headers["x-prefixgate-cached-tokens"] = str(usage.cached_tokens)
    return Response(content, status_code=resp.status_code, headers=out_headers,
                    media_type=resp.headers.get("content-type", "application/json"))


async def _list_models(state: ProxyState) -> dict[str, Any]:
    """OpenAI ``{"object": "list", "data": [{"id", "object": "model", "owned_by"}]}``: the
    models of local / OpenAI-compatible backends (asked live, 2 s timeout) plus every route glob
    without wildcards."""
    seen: dict[str, str] = {}
    client = state.upstream.client
    for name, b in state.policy.backends.items():
        if b.kind not in ("local", "openai_compat") or client is None:
            continue
        try:
            resp = await client.get(b.base_url + "/models", timeout=2.0)
            listed = resp.json().get("data")
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        for m in listed if isinstance(listed, list) else []:  # a wrong shape adds nothing
            if isinstance(m, dict) and isinstance(m.get("id"), str):
                seen.setdefault(m["id"], name)
    for route in state.policy.routes:
        if not any(c in route.match for c in "*?["):
            seen.setdefault(route.match, route.backend)
    return {"object": "list",
            "data": [{"id": k, "object": "model", "created": 0, "owned_by": v}
                     for k, v in seen.items()]}


def build_app(policy: Policy, *, ledger: Ledger | None = None,
              sessions: SessionStore | None = None, rewrite_fn: RewriteFn | None | str = "default",
              transport: httpx.AsyncBaseTransport | None = None, analyze: bool = True
              ) -> FastAPI:
    """The proxy app for ``policy``.

    ``ledger``: default ``Ledger(policy.ledger.path)``; ``sessions``: default Redis when
    ``policy.ledger.redis_url`` is set, else in-process LRU; ``rewrite_fn``: the rewrite
    pipeline (default :func:`rewriter.pipeline.rewrite_request`; None = never rewrite);
    ``transport``: httpx transport for the upstream client (tests); ``analyze``: run the
    cache-break detector and the counterfactual cache model after each request
    (:mod:`proxy.insight`).
    """
    if sessions is None:
        url = policy.ledger.redis_url
        sessions = RedisSessionStore(url) if url else MemorySessionStore()
    state = ProxyState(
        policy=policy,
        ledger=ledger if ledger is not None else Ledger(policy.ledger.path),
        sessions=sessions,
        rewrite_fn=default_rewrite_fn() if rewrite_fn == "default" else rewrite_fn,  # type: ignore[arg-type]
        upstream=Upstream(transport),
        metrics=ProxyMetrics(),
        insight=Insight(policy.ledger.store_prompt_text) if analyze else None,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.upstream.start()
        try:
            yield
        finally:
            await state.upstream.close()

    app = FastAPI(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.proxy = state

    @app.exception_handler(ProxyError)
    async def _on_proxy_error(request: Request, exc: ProxyError) -> Response:
        return error_response(exc, api_for_path(request.url.path))

    @app.exception_handler(Exception)
    async def _on_bug(request: Request, exc: Exception) -> Response:
        # last resort: a shaped 500 (InternalError logs the traceback), never a bare text one
        return error_response(InternalError.wrap(exc), api_for_path(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _on_routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        # no route (404) / wrong method (405): the caller's shape, not FastAPI's {"detail"}
        err = UnknownEndpoint(request.method, request.url.path, exc.status_code)
        return error_response(err, api_for_path(request.url.path), dict(exc.headers or {}))

    @app.post("/v1/chat/completions", openapi_extra=request_body(OPENAI_CHAT_REQUEST))
    async def chat_completions(request: Request) -> Response:
        return await _proxy(state, request, "openai")

    @app.post("/v1/messages", openapi_extra=request_body(ANTHROPIC_MESSAGES_REQUEST))
    async def messages(request: Request) -> Response:
        return await _proxy(state, request, "anthropic")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(await _list_models(state))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "backends": sorted(policy.backends)})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def route_for(policy: Policy, model: str, api: Api) -> Target:
    """Where ``model`` would go for a client of ``api`` (for ``prefixgate report`` / tests)."""
    return pick_target(policy, model, api, can_translate=True)
