"""The proxy's HTTP surface: :func:`build_app` returns the FastAPI app.

A request's path, top to bottom in :func:`_proxy` — each step is a call into the module that owns
it, with the request's state in one :class:`Exchange`::

    auth     proxy.auth        proxy key (when configured), per-key rate limits   (401 / 429)
    parse    proxy.limits      body read once under max_body_bytes and its deadline,
             proxy.wire        JSON (numbers exact), nesting limit, fields checked (400/408/413)
    route    proxy.router      policy route -> backend, provider, upstream URL    (404 / 501)
    passes   proxy.rewriting   session id, opt-out header, rewriter pipeline in a worker thread
                               under rewrite.time_budget_ms              (fail-open, over_budget)
    bridge   proxy.translate   upstream body, stream watcher + event mapper       (400)
    send     proxy.relay       allowlisted headers + backend key, shared client   (502 / 504)
                               abandoned when the client leaves before the headers (499)
    relay    proxy.relay       SSE event by event, or the JSON body; TTFT / TPOT timed
    record   cache.ledger      one row per request, metrics, session memory merged,
             proxy.insight     cache breaks + counterfactual cached tokens (after the answer)

Invariants (issue 8, classes 1 and 7): whatever can fail on the client's body fails before the
send; from the send on, the upstream response is closed on every path (:func:`_answer`, then
:class:`~proxy.relay.StreamRelay`); each request writes exactly one ledger row whose
``http_status`` is the status of the response the client got (499 when it got none).

Endpoints: ``POST /v1/chat/completions`` (OpenAI), ``POST /v1/messages`` (Anthropic); a client
whose API differs from its backend's goes through a bridge (:mod:`proxy.translate`),
``GET /v1/models``, ``GET /healthz`` (``{"status": "ok" | "degraded", "reasons": [...],
"backends": [...]}``, 503 when degraded, see :mod:`proxy.health`), ``GET /api/savings``
(:mod:`proxy.savings_api`; holdout A/B membership: :mod:`proxy.holdout`), ``GET /metrics`` (HEAD too
wherever GET is served); any other path or method is a 404 / 405 in the caller's shape; a
trailing slash is served, never redirected. Response headers: ``x-prefixgate-edits`` (the
rewrite summary, or ``off``), ``x-prefixgate-tokens-pruned``, ``x-prefixgate-edit-detail`` when
the policy opts in (:mod:`proxy.edit_detail`), and ``x-prefixgate-cached-tokens``
on non-streamed answers, and on streams whose backend reports cached tokens in its response
headers (our engine's ``X-Engine-Cached-Tokens``); other streams' headers leave before usage is
known.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
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
from proxy import exactjson, savings_api, translate, wire
from proxy.auth import Guard
from proxy.dashboard import install as install_dashboard
from proxy.edit_detail import edit_detail_headers
from proxy.errors import (
    Api,
    ClientDisconnected,
    InternalError,
    ProxyError,
    UnknownEndpoint,
    UpstreamUnavailable,
    api_for_path,
    error_response,
    upstream_error_body,
)
from proxy.fanout import gate_for
from proxy.headers import downstream_headers, upstream_headers
from proxy.health import LoopLagMonitor, health_reasons
from proxy.holdout import in_holdout
from proxy.insight import Analysis, Insight, input_cost_usd
from proxy.limits import check_nesting, read_body_within
from proxy.logsafe import safe
from proxy.metrics import ProxyMetrics, RequestObs, policy_models
from proxy.openapi_schemas import ANTHROPIC_MESSAGES_REQUEST, OPENAI_CHAT_REQUEST, request_body
from proxy.otel import GenAITelemetry, telemetry_from_env
from proxy.record_extras import (
    EngineTimings,
    apply_reported_timings,
    engine_timings,
    pass_tokens_json,
)
from proxy.relay import (
    SSE_HEADERS,
    EventMapper,
    SSEResponse,
    StreamRelay,
    StreamWatcher,
    Timing,
    Upstream,
    read_at_most,
    send_unless_gone,
)
from proxy.rewriting import (
    RewriteFn,
    RewriteOutcome,
    default_rewrite_fn,
    off_loop,
    rewrite_off_loop,
    rewrite_wanted,
    session_hash,
    session_id_for,
)
from proxy.router import Target, pick_target
from proxy.slashes import TrailingSlash
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
# An upstream error body is read up to this much; the rest is dropped (cut, it is no longer JSON
# and is answered in the caller's shape, quoting its start).
ERROR_BODY_MAX_BYTES = 1 << 20
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
    guard: Guard = field(default_factory=Guard.open)  # proxy keys + rate limits (proxy.auth)
    loop_lag: LoopLagMonitor = field(default_factory=LoopLagMonitor)
    otel: GenAITelemetry | None = None  # OTLP export, only when OTEL_EXPORTER_OTLP_* is set

    def record(self, row: LedgerRow, obs: RequestObs | None = None) -> None:
        """Write the row and count it; never raises (a ledger failure must not fail a request)."""
        try:
            self.ledger.write(row)
            self.metrics.observe(row, obs)
            if self.otel is not None:
                self.otel.observe(row, obs)
        except Exception:
            log.exception("ledger write failed")
        self.guard.charge(row.key_id, row.prompt_tokens, row.output_tokens)
        log.debug("%s %s backend=%s status=%s http=%s prompt=%s cached=%s ttft_ms=%s edits=%s",
                 safe(row.endpoint), safe(row.model), row.backend, row.status, row.http_status,
                 row.prompt_tokens, row.cached_tokens,
                 None if row.ttft_ms is None else round(row.ttft_ms, 1), row.edits)

    def health(self) -> list[str]:
        """Reasons the proxy is degraded now (empty: healthy), see :mod:`proxy.health`."""
        return health_reasons(self.upstream.in_use, self.upstream.max_connections,
                              self.upstream.pool_stats().get("queued", 0),
                              self.loop_lag.recent_max_s)


@dataclass
class Exchange:
    """One request, from parse to record: what each step of :func:`_proxy` found or made.

    ``row`` is written exactly once (:meth:`record`); ``http_status`` is set there, from the
    response the client is given (the upstream's status only when the client got that status).
    """

    api: Api
    row: LedgerRow
    timing: Timing = field(default_factory=Timing)
    raw: bytes = b""
    body: dict[str, Any] = field(default_factory=dict)
    target: Target | None = None
    session_id: str = ""
    rw: RewriteOutcome | None = None
    up_raw: bytes = b""
    watcher: StreamWatcher | None = None
    mapper: EventMapper | None = None
    recorded: bool = False
    obs: RequestObs = field(default_factory=RequestObs)  # for metrics / traces (proxy.metrics)
    reported: EngineTimings = field(default_factory=EngineTimings)  # the backend's timings

    def record(self, state: ProxyState, status: str, http_status: int) -> None:
        """Write the row with ``status`` / ``http_status``; a second call is a no-op."""
        if self.recorded:
            return
        self.recorded = True
        self.row.status, self.row.http_status = status, http_status
        if self.row.total_ms is None:
            self.row.total_ms = self.timing.total_ms()
        state.record(self.row, self.obs)


_SENT_AS_IS = ("none", "off", "unavailable")  # edit summaries of bodies sent unchanged


async def _finish(state: ProxyState, ex: Exchange, usage: Usage, status: str, http_status: int,
                  analyze: Callable[[], Awaitable[Analysis]] | None = None,
                  memory: bool = False) -> None:
    """Fill the row's usage and timing, merge the rewrite's session memory (``memory``), run
    the break / counterfactual analysis (``analyze``), record. Whatever fails in between, the
    row is written (with what is known)."""
    row, timing = ex.row, ex.timing
    try:
        row.prompt_tokens, row.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        row.cache_write_tokens = usage.cache_write_tokens
        deltas = ex.watcher.deltas if ex.watcher is not None else 0
        row.output_tokens = usage.output_tokens if usage.output_tokens is not None else (
            deltas if row.stream and deltas else None)
        row.ttft_ms = timing.ttft_ms()
        ex.obs.response_model = ex.obs.response_model or getattr(ex.watcher, "model", None)
        row.tpot_ms = timing.tpot_ms(row.output_tokens)
        row.total_ms = timing.total_ms()
        apply_reported_timings(row, ex.reported)
        if memory and ex.rw is not None and ex.rw.memory:
            try:
                state.sessions.merge(ex.session_id, ex.rw.memory)
            except Exception:
                log.exception("session memory merge failed")
        row.input_usd = input_cost_usd(row.model, row.prompt_tokens, row.cached_tokens,
                                       row.cache_write_tokens)
        if analyze is not None:  # tokenize + CPU work off the loop, bounded (proxy.insight)
            a = await analyze()
            row.cf_cached_tokens, row.cf_input_usd = a.cf_cached_tokens, a.cf_input_usd
            row.cf_source = "holdout" if row.holdout else a.cf_source
            if row.edits in _SENT_AS_IS and row.cached_tokens is not None:
                # the client's own body went upstream: what it would have cached is what it did
                # cache; the model's estimate would only add its error (template tokens, tokenizer)
                row.cf_cached_tokens, row.cf_input_usd = row.cached_tokens, row.input_usd
                row.cf_source = "holdout" if row.holdout else "measured"
            if a.brk is not None:
                ex.obs.break_kind = a.brk.get("kind")
                try:
                    state.ledger.write_break(row.session, a.brk)
                except Exception:
                    log.exception("break record write failed")
    except Exception:
        log.exception("after-answer accounting failed; the row keeps what is known")
    finally:
        ex.record(state, status, http_status)


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        return False


async def _proxy(state: ProxyState, request: Request, api: Api) -> Response:
    """Serve one model request end to end (see module docstring).

    Everything that can be checked or translated happens before the send; from the send on, the
    upstream response is owned by :func:`_answer`, which closes it on every path. Every request
    writes exactly one ledger row (:meth:`Exchange.record`).
    """
    ex = Exchange(api, LedgerRow(endpoint=request.url.path))
    try:
        ex.row.key_id = await state.guard.admit(request.headers, api)   # 0. auth (401 / 429)
        await _parse(ex, request, state.policy)                        # 1. parse
        _route(ex, state.policy)                                        # 2. route
        await _passes(ex, request, state)                               # 3. passes
        _bridge(ex, state.policy.limits.max_json_depth)                 # 4. bridge
        resp = await _send(ex, request, state)                          # 5. send
    except BaseException as e:
        return _refuse(state, ex, e)
    return await _answer(state, ex, resp)                               # 6. relay, 7. record


def _refuse(state: ProxyState, ex: Exchange, e: BaseException) -> Response:
    """The shaped error for an exception (a bug becomes InternalError, 500), recorded; a
    cancellation (server shutdown) is recorded as ``client_disconnect`` and re-raised."""
    if not isinstance(e, Exception):
        ex.row.error = type(e).__name__
        ex.record(state, "client_disconnect", ClientDisconnected.status)
        raise e
    exc = e if isinstance(e, ProxyError) else InternalError.wrap(e)
    response = error_response(exc, ex.api)
    ex.row.error = exc.message[:200]
    status = "client_disconnect" if isinstance(exc, ClientDisconnected) else type(exc).__name__
    ex.record(state, status, response.status_code)
    return response


async def _parse(ex: Exchange, request: Request, policy: Policy) -> None:
    """Read the body once within the body deadline (400 / 408 / 413), check its nesting
    before any pass or bridge and what the proxy relies on (400)."""
    ex.raw = await read_body_within(request, policy.max_body_bytes, policy.limits.body_timeout_s)
    ex.obs.read_done = time.perf_counter()
    ex.body = wire.parse_json(ex.raw)
    await check_nesting(ex.body, policy.limits.max_json_depth, len(ex.raw))
    (wire.check_anthropic if ex.api == "anthropic" else wire.check_openai)(ex.body)
    ex.row.model, ex.row.stream = ex.body["model"], wire.is_stream(ex.body)


def _route(ex: Exchange, policy: Policy) -> None:
    """Pick the backend (404 / 501)."""
    ex.target = pick_target(policy, ex.row.model, ex.api, can_translate=True)
    ex.row.route, ex.row.backend = ex.target.route, ex.target.backend_name


async def _passes(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Session id and the rewriter's passes, off the event loop under the rewrite time budget
    (fail-open: never raises for a pass; over budget the client's bytes go out)."""
    assert ex.target is not None
    policy = state.policy
    ex.session_id = session_id_for(request.headers, ex.body)
    ex.row.session = session_hash(ex.session_id)
    ctx = None
    ex.row.holdout = in_holdout(ex.session_id, policy.holdout)  # A/B: sent as if opted out
    ex.row.cf_source = "holdout" if ex.row.holdout else ""
    if rewrite_wanted(request.headers, policy.rewrite) and not ex.row.holdout:
        ctx = Context(settings=policy.rewrite, model=ex.row.model, provider=ex.target.provider,
                      session_id=ex.session_id, session=state.sessions.get(ex.session_id),
                      now_s=time.time(), masks_tools=ex.target.backend.kind == "local")
    ex.rw = await rewrite_off_loop(state.rewrite_fn, ex.body, ex.raw, ex.api, ctx)
    ex.row.rewrite, ex.row.edits, ex.row.tokens_pruned = ctx is not None, ex.rw.summary, ex.rw.pruned
    if policy.rewrite.edit_detail_header and ctx is not None:  # opt-in (proxy.edit_detail)
        ex.obs.headers = await off_loop(lambda: edit_detail_headers(ex.body, ex.rw, ex.api),
                                        policy.rewrite.time_budget_ms, None)
    ex.row.pass_tokens = pass_tokens_json(ex.rw.edits)


def _bridge(ex: Exchange, max_depth: int) -> None:
    """The upstream bytes, and for a stream the watcher and the event mapper: everything that
    can fail on the client's body fails here, before anything is sent (400). ``max_depth``:
    policy ``limits.max_json_depth``, also applied to JSON a bridge parses out of strings."""
    assert ex.target is not None and ex.rw is not None
    target = ex.target
    ex.up_raw = translate.encode(ex.api, ex.rw.body, max_depth) if target.translate else (
        ex.rw.raw)
    if ex.row.stream:
        ex.watcher = AnthropicStreamWatcher() if target.wire == "anthropic" else (
            OpenAIStreamWatcher())
        if target.translate:
            ex.mapper = translate.mapper(ex.api, ex.row.model, ex.watcher, ex.body)


async def _send(ex: Exchange, request: Request, state: ProxyState) -> httpx.Response:
    """Send upstream (502 / 504); abandoned (499) if the client leaves before the headers."""
    assert ex.target is not None
    target = ex.target
    headers = upstream_headers(request.headers.items(), target.backend, target.api_key())
    ex.obs.sent_at = time.perf_counter()
    async with gate_for(state).turn(ex.rw.body if ex.rw else ex.body, target.provider):  # fanout.py
        send = state.upstream.send(target.url(), headers, ex.up_raw, target.backend.timeout_s)
        return await send_unless_gone(send, lambda: _client_gone(request))


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects (its body has been read: the next ASGI message is
    ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        await anyio.sleep(0.05)  # a server that sends empty bodies: do not spin


async def _answer(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """The client's response from the upstream's ``resp``, which is closed on every path: by
    the relay for a stream, here otherwise. Anything that raises is closed, shaped, recorded."""
    try:
        if resp.status_code >= 400:
            return await _upstream_error(state, ex, resp)
        if ex.row.stream:
            return await _stream(state, ex, resp)
        return await _json_answer(state, ex, resp)
    except BaseException as e:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        if ex.recorded:
            raise
        return _refuse(state, ex, e)


def _ours(ex: Exchange, resp: httpx.Response) -> dict[str, str]:
    """The proxy's own response headers, and the upstream's that the client gets."""
    assert ex.rw is not None
    ex.reported = engine_timings(resp.headers)
    out = {**downstream_headers(resp.headers), "x-prefixgate-edits": ex.rw.summary,
           "x-prefixgate-tokens-pruned": str(ex.rw.pruned), **(ex.obs.headers or {})}
    early = usage_from_headers(resp.headers)  # engines that report usage in headers
    if early.cached_tokens is not None:
        out["x-prefixgate-cached-tokens"] = str(early.cached_tokens)
    return out


async def _upstream_error(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """The upstream's own 4xx / 5xx, passed through with its status, its ``retry-after`` and
    rate-limit headers, and its body in the client's shape."""
    assert ex.target is not None
    try:
        err = await read_at_most(resp, ERROR_BODY_MAX_BYTES)
    except httpx.HTTPError:
        err = b""
    finally:
        await resp.aclose()
    media = resp.headers.get("content-type", JSON)
    if not _is_json_object(err):  # an HTML page, an empty body: put in the caller's shape
        err, media = orjson.dumps(upstream_error_body(err, resp.status_code, ex.api)), JSON
    elif ex.target.translate:
        err, media = orjson.dumps(translate.error(ex.api, err, resp.status_code)), JSON
    ex.row.error = f"upstream {resp.status_code}"
    response = Response(err, status_code=resp.status_code, headers=_ours(ex, resp),
                        media_type=media)
    await _finish(state, ex, Usage(), "upstream_error", response.status_code)
    return response


def _analyzer(state: ProxyState, ex: Exchange) -> Callable[[], Awaitable[Analysis]]:
    """The after-answer analysis of this request (cache breaks, counterfactual)."""
    async def analyze() -> Analysis:
        if state.insight is None or len(ex.raw) > ANALYZE_MAX_BYTES:
            return Analysis()
        assert ex.target is not None and ex.rw is not None
        return await state.insight.analyze(
            state.upstream, ex.target, api=ex.api, session=ex.row.session, model=ex.row.model,
            original=ex.body, sent=ex.rw.body, budget_ms=state.policy.rewrite.time_budget_ms,
            max_depth=state.policy.limits.max_json_depth)
    return analyze


async def _stream(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """Hand ``resp`` to a :class:`StreamRelay`; from here it closes it."""
    assert ex.target is not None and ex.watcher is not None
    ctype = resp.headers.get("content-type", "")
    if not ctype.startswith("text/event-stream"):
        await resp.aclose()  # a plain body where SSE was asked for: not relayable as a stream
        ex.row.error = "not an SSE stream"
        response = error_response(UpstreamUnavailable(
            f"upstream {ex.target.backend_name!r} answered a streamed request with "
            f"{ctype.split(';')[0] or 'no content type'} instead of an event stream"), ex.api)
        await _finish(state, ex, Usage(), "upstream_error", response.status_code)
        return response
    ex.watcher.usage.merge(usage_from_headers(resp.headers))
    watcher, analyze = ex.watcher, _analyzer(state, ex)

    async def on_end(status: str, http_status: int) -> None:
        await _finish(state, ex, watcher.usage, status, http_status, analyze, memory=True)

    relay = StreamRelay(resp, watcher, ex.timing, on_end, ex.mapper, ex.api)
    return SSEResponse(relay, headers={**_ours(ex, resp), **SSE_HEADERS})


async def _json_answer(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """Read, check and (bridged) translate a non-streamed answer; 502 when it broke off or
    cannot be read."""
    assert ex.target is not None
    headers = _ours(ex, resp)
    try:
        content = await resp.aread()
        answer = (exactjson.loads if ex.target.translate else orjson.loads)(content)
        if not isinstance(answer, dict):
            raise TypeError("answer is not a JSON object")
        usage = usage_from_headers(resp.headers)
        usage.merge(usage_from_answer(answer, ex.target.wire))
        model = answer.get("model")
        ex.obs.response_model = model[:200] if isinstance(model, str) else None
        if ex.target.translate:
            content = exactjson.dumps(translate.response(ex.api, answer, ex.row.model))
    except (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        # the body broke off, is not a JSON object, or has a shape the bridge cannot translate
        ex.row.error = type(e).__name__
        response = error_response(UpstreamUnavailable(
            f"upstream {ex.target.backend_name!r} broke off or sent an unreadable answer"), ex.api)
        await _finish(state, ex, Usage(), "upstream_error", response.status_code)
        return response
    finally:
        await resp.aclose()
    ex.timing.end = time.perf_counter()
    if usage.cached_tokens is not None:
        headers["x-prefixgate-cached-tokens"] = str(usage.cached_tokens)
    response = Response(content, status_code=resp.status_code, headers=headers,
                        media_type=resp.headers.get("content-type", JSON))
    await _finish(state, ex, usage, "ok", response.status_code, _analyzer(state, ex), memory=True)
    return response


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
        metrics=ProxyMetrics(policy_models(policy.routes)),
        insight=Insight(policy.ledger.store_prompt_text) if analyze else None,
        guard=Guard.from_policy(policy.auth, policy.ledger),
        otel=telemetry_from_env(policy),
    )

    state.metrics.watch_resources(lambda: state.upstream.in_use, state.upstream.pool_stats,
                                  lambda: state.loop_lag.last_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.upstream.start()
        state.loop_lag.start()
        try:
            yield
        finally:
            await state.loop_lag.stop()
            await state.upstream.close()
            if state.otel is not None:
                await anyio.to_thread.run_sync(state.otel.shutdown)  # flush the batches

    # redirect_slashes=False: Starlette's slash redirect builds Location from the client's Host
    app = FastAPI(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None,
                  redirect_slashes=False)
    app.add_middleware(TrailingSlash)  # /v1/messages/ is served as /v1/messages, no redirect
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

    # HEAD: the same handler, left out of the OpenAPI schema (one operation id per route)
    @app.get("/v1/models")
    @app.head("/v1/models", include_in_schema=False)
    async def models(request: Request) -> JSONResponse:
        await state.guard.admit(request.headers, "openai", limit=False)  # 401 without a key
        return JSONResponse(await _list_models(state))

    @app.get("/healthz")  # open: no key (see proxy.auth)
    @app.head("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        # 503 + reasons past the thresholds of proxy.health, so a balancer stops sending first
        reasons = state.health()
        return JSONResponse({"status": "degraded" if reasons else "ok", "reasons": reasons,
                             "backends": sorted(policy.backends)},
                            status_code=503 if reasons else 200)

    savings_api.install(app, state.ledger, policy, state.guard)

    @app.get("/metrics")  # open: no key (see proxy.auth)
    @app.head("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    install_dashboard(app, state.guard)  # GET /dashboard (proxy.dashboard)
    return app


def route_for(policy: Policy, model: str, api: Api) -> Target:
    """Where ``model`` would go for a client of ``api`` (for ``prefixgate report`` / tests)."""
    return pick_target(policy, model, api, can_translate=True)
