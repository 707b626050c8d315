"""The proxy's HTTP surface: :func:`build_app` returns the FastAPI app.

A request's path reads prepare -> send (with retries) -> answer -> record in :func:`_proxy`;
each step is a call into the module that owns it, the request's state in one
:class:`~prefixgate.proxy.pipeline.exchange.Exchange`::

    prepare  proxy.auth        proxy key (when configured), per-key rate limits   (401 / 429)
             proxy.limits      body read once under max_body_bytes and its deadline,
             proxy.wire        JSON (numbers exact), nesting limit, fields checked (400/408/413)
             proxy.router      alias, route -> backends in order, fallbacks       (404 / 501)
             proxy.rewriting   session id, opt-out header, rewriter pipeline in a worker thread
                               under rewrite.time_budget_ms              (fail-open, over_budget)
             proxy.bridges     one bridge per target: upstream bytes              (400)
    send     proxy.failover    deployment (proxy.balance: affinity + load guard, breakers),
                               retries with backoff, then the next deployment / backend, all
                               before the first byte reaches the client           (502 / 504)
                               abandoned when the client leaves before the headers (499)
    answer   proxy.answer      the upstream's error in the client's shape, SSE event by event,
                               or the JSON body mapped by the bridge; TTFT / TPOT timed; every
                               failure from here on raises into one mapping (proxy.answer.refuse)
    record   cache.ledger      one row per request (deployment, attempts, reasons), metrics,
             proxy.insight     session memory merged, cache breaks + counterfactual

Invariants (issue 8, classes 1 and 7): whatever can fail on the client's body fails before the
send; from the send on, the upstream response is closed on every path
(:func:`prefixgate.proxy.pipeline.answer.answer`, then
:class:`~prefixgate.proxy.upstream.relay.StreamRelay`); each request writes exactly one ledger row whose
``http_status`` is the status of the response the client got (499 when it got none).

Endpoints: ``POST /v1/chat/completions`` (OpenAI), ``POST /v1/messages`` (Anthropic); a client
whose API differs from its backend's goes through a bridge (:mod:`prefixgate.proxy.bridges.translate`),
``GET /v1/models`` (exactly what a client can call, :func:`prefixgate.proxy.routing.probes.list_models`), the
Responses API (:mod:`prefixgate.proxy.api.responses`), ``/v1/messages/count_tokens``
(:mod:`prefixgate.proxy.api.count_tokens`), ``/v1/embeddings``, ``/v1/completions`` and ``/v1/models/{id}``
(:mod:`prefixgate.proxy.api.passthrough`), every API route also without ``/v1``
(:mod:`prefixgate.proxy.http.middleware`),
``GET /healthz`` (``{"status": "ok" | "degraded", "reasons": [...], "backends": [...],
"down": {deployment: why}}``, 503 when degraded, see :mod:`prefixgate.proxy.observe.health`; a deployment
whose breaker is not closed is named in ``down`` without degrading the proxy, which still serves
every other route), ``GET /api/savings`` (:mod:`prefixgate.proxy.observe.savings_api`; holdout A/B membership:
:mod:`prefixgate.proxy.pipeline.holdout`), ``GET /dashboard`` (:mod:`prefixgate.proxy.observe.dashboard`),
``GET /metrics`` (HEAD too
wherever GET is served); any other path or method is a 404 / 405 in the caller's shape; a
trailing slash is served, never redirected. Response headers: ``x-prefixgate-edits`` (the
rewrite summary, or ``off``), ``x-prefixgate-tokens-pruned``, ``x-prefixgate-edit-detail`` when
the policy opts in (:mod:`prefixgate.proxy.pipeline.edit_detail`), and ``x-prefixgate-cached-tokens``
on non-streamed answers, and on streams whose backend reports cached tokens in its response
headers (our engine's ``X-Engine-Cached-Tokens``); other streams' headers leave before usage is
known.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger import Ledger, LedgerRow
from prefixgate.cache.ledger_writer import open_ledger
from prefixgate.cache.redis_link import RedisLink
from prefixgate.cache.session import MemorySessionStore, SessionStore
from prefixgate.cache.session_redis import SharedSessionStore
from prefixgate.cache.shared_state import LocalState, RedisState
from prefixgate.config.routing import Deployment
from prefixgate.config.schema import Policy
from prefixgate.proxy.api import count_tokens, passthrough
from prefixgate.proxy.api import responses as responses_api
from prefixgate.proxy.api.openapi_schemas import ANTHROPIC_MESSAGES_REQUEST, OPENAI_CHAT_REQUEST, request_body
from prefixgate.proxy.bridges.base import bridge_for
from prefixgate.proxy.core.errors import (
    Api,
    InternalError,
    ProxyError,
    UnknownEndpoint,
    api_for_path,
    error_response,
)
from prefixgate.proxy.http import body as wire
from prefixgate.proxy.http.auth import Guard
from prefixgate.proxy.http.headers import upstream_headers
from prefixgate.proxy.http.limits import check_nesting, read_body_within
from prefixgate.proxy.http.middleware import BarePaths, TrailingSlash
from prefixgate.proxy.http.tenants import namespaced_session, salted_body, tenant_for
from prefixgate.proxy.observe import savings_api
from prefixgate.proxy.observe.dashboard import install as install_dashboard
from prefixgate.proxy.observe.insight import Insight
from prefixgate.proxy.observe.metrics import ProxyMetrics, policy_models
from prefixgate.proxy.observe.otel import telemetry_from_env
from prefixgate.proxy.pipeline.answer import answer, refuse
from prefixgate.proxy.pipeline.edit_detail import edit_detail_headers
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.holdout import in_holdout
from prefixgate.proxy.pipeline.output_cap import with_default_cap
from prefixgate.proxy.pipeline.record import pass_tokens_json
from prefixgate.proxy.pipeline.rewrite import (
    RewriteFn,
    default_rewrite_fn,
    off_loop,
    rewrite_off_loop,
    rewrite_wanted,
    session_hash,
    session_id_for,
)
from prefixgate.proxy.routing.fanout import gate_for
from prefixgate.proxy.routing.probes import cache_matches, health_check_loop, list_models
from prefixgate.proxy.routing.retries import Sender, Step
from prefixgate.proxy.routing.router import Target, pick_target, plan_targets
from prefixgate.proxy.upstream.relay import Upstream, send_unless_gone
from prefixgate.rewriter.types import Context

__all__ = ["ProxyState", "build_app", "route_for"]


async def _proxy(state: ProxyState, request: Request, api: Api) -> Response:
    """Serve one model request end to end (see module docstring).

    Everything that can be checked or translated happens before the send; from the send on, the
    upstream response is owned by :func:`prefixgate.proxy.pipeline.answer.answer`, which closes it on every
    path. Every request writes exactly one ledger row (:meth:`Exchange.record`).
    """
    ex = Exchange(api, LedgerRow(endpoint=request.url.path))
    try:
        await _prepare(ex, request, state)                              # prepare
        resp = await _send(ex, request, state)                          # send (with retries)
    except BaseException as e:
        return refuse(state, ex, e)
    return await answer(state, ex, resp)                                # answer, record


async def _prepare(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Auth, parse, route, passes, bridges: everything that can fail on the client's request
    fails here, before anything is sent."""
    ex.row.key_id = await state.guard.admit(request.headers, ex.api)   # 401 / 429
    ex.row.tenant = tenant_for(request.headers, ex.row.key_id, state.policy, state.guard)
    await _parse(ex, request, state.policy)
    ex.targets = plan_targets(state.policy, ex.row.model, ex.api, can_translate=True)
    ex.row.route, ex.row.backend = ex.targets[0].route, ex.targets[0].backend_name
    # a body without an output cap gets the route's (proxy.bounded)
    ex.body, ex.raw = with_default_cap(ex.body, ex.raw, ex.api, ex.targets[0], state.policy)
    await _passes(ex, request, state)
    ex.steps = _bridges(ex, state.policy.limits.max_json_depth)
    for s in ex.steps:  # the tenant's prefix-cache namespace on the backend (proxy.tenants)
        if s.target.wire == "openai":
            s.body = salted_body(s.body, ex.row.tenant, s.target.backend)


async def _parse(ex: Exchange, request: Request, policy: Policy) -> None:
    """Read the body once within the body deadline (400 / 408 / 413), check its nesting
    before any pass or bridge and what the proxy relies on (400)."""
    ex.raw = await read_body_within(request, policy.max_body_bytes, policy.limits.body_timeout_s)
    ex.obs.read_done = time.perf_counter()
    ex.body = wire.parse_json(ex.raw)
    await check_nesting(ex.body, policy.limits.max_json_depth, len(ex.raw))
    (wire.check_anthropic if ex.api == "anthropic" else wire.check_openai)(ex.body)
    ex.row.model, ex.row.stream = ex.body["model"], wire.is_stream(ex.body)


async def _passes(ex: Exchange, request: Request, state: ProxyState) -> None:
    """Session id and the rewriter's passes (for the primary backend's cache rules), off the
    event loop under the rewrite time budget (fail-open: never raises for a pass; over budget
    the client's bytes go out)."""
    policy, primary = state.policy, ex.targets[0]
    ex.session_id = namespaced_session(ex.row.tenant, session_id_for(request.headers, ex.body))
    ex.row.session = session_hash(ex.session_id)
    ctx = None
    ex.row.holdout = in_holdout(ex.session_id, policy.holdout)  # A/B: sent as if opted out
    ex.row.cf_source = "holdout" if ex.row.holdout else ""
    if rewrite_wanted(request.headers, policy.rewrite) and not ex.row.holdout:
        ctx = Context(settings=policy.rewrite, model=ex.row.model, provider=primary.provider,
                      session_id=ex.session_id, session=await state.sessions.aget(ex.session_id),
                      now_s=time.time(), masks_tools=primary.backend.kind == "local")
    ex.rw = await rewrite_off_loop(state.rewrite_fn, ex.body, ex.raw, ex.api, ctx)
    ex.row.rewrite, ex.row.edits, ex.row.tokens_pruned = ctx is not None, ex.rw.summary, ex.rw.pruned
    if policy.rewrite.edit_detail_header and ctx is not None:  # opt-in (proxy.edit_detail)
        ex.obs.headers = await off_loop(lambda: edit_detail_headers(ex.body, ex.rw, ex.api),
                                        policy.rewrite.time_budget_ms, None)
    ex.row.pass_tokens = pass_tokens_json(ex.rw.edits)


def _bridges(ex: Exchange, max_depth: int) -> list[Step]:
    """One :class:`Step` per target: its bridge and upstream bytes. The primary's bridge
    failing is the client's 400; a fallback that cannot carry the request is left out.
    ``max_depth``: policy ``limits.max_json_depth``, also applied to JSON a bridge parses out
    of strings."""
    assert ex.rw is not None
    steps: list[Step] = []
    made: dict[tuple[Api, str | None], bytes] = {}
    for i, t in enumerate(ex.targets):
        bridge = bridge_for(ex.api, t.wire)
        try:
            if (t.wire, t.model) not in made:
                made[(t.wire, t.model)] = bridge.encode(ex.rw.body, ex.rw.raw, t.model, max_depth)
        except ProxyError as e:
            if i == 0:
                raise
            ex.attempts.failed(t.backend_name, f"bridge-{type(e).__name__}")
            continue
        steps.append(Step(t, bridge, made[(t.wire, t.model)]))
    return steps


async def _send(ex: Exchange, request: Request, state: ProxyState) -> httpx.Response:
    """Send through the failover loop (502 / 504 when no deployment answered); abandoned (499)
    if the client leaves before the headers."""
    def headers_for(t: Target) -> dict[str, bytes]:
        return upstream_headers(request.headers.items(), t.backend, t.api_key())

    ex.obs.sent_at = time.perf_counter()
    assert ex.rw is not None
    async with gate_for(state).turn(ex.rw.body, ex.targets[0].provider):  # proxy.fanout
        run = _sender(state).run(ex.steps, headers_for, ex.session_id, ex.attempts, ex.picked)
        return await send_unless_gone(run, lambda: _client_gone(request))


def _sender(state: ProxyState) -> Sender:
    async def match(t: Target, deps: list[Deployment], body: bytes) -> list[int]:
        if state.side is None:
            return [0] * len(deps)
        return await cache_matches(state.side, t, deps, body)

    assert state.breakers is not None
    return Sender(state.upstream.send, state.policy.retry, state.breakers, state.balancer, match,
                  shared=state.routing)


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects (its body has been read: the next ASGI message is
    ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        await anyio.sleep(0.05)  # a server that sends empty bodies: do not spin


def _health(state: ProxyState) -> tuple[list[str], dict[str, str]]:
    """(reasons the proxy is degraded, ``{deployment: "open: <last failure>"}`` for every
    deployment whose breaker is not closed)."""
    assert state.breakers is not None
    return state.health(), state.breakers.down()


def build_app(policy: Policy, *, ledger: Ledger | None = None,
              sessions: SessionStore | None = None, rewrite_fn: RewriteFn | None | str = "default",
              transport: httpx.AsyncBaseTransport | None = None, analyze: bool = True
              ) -> FastAPI:
    """The proxy app for ``policy``.

    ``ledger``: default :func:`prefixgate.cache.ledger_writer.open_ledger` (batched writer thread, flushed
    when the app stops); ``sessions``: default :class:`prefixgate.cache.session_redis.SharedSessionStore`
    when ``policy.ledger.redis_url`` is set, else in-process LRU; ``rewrite_fn``: the rewrite
    pipeline (default :func:`prefixgate.rewriter.pipeline.rewrite_request`; None = never rewrite);
    ``transport``: httpx transport for the upstream client (tests); ``analyze``: run the
    cache-break detector and the counterfactual cache model after each request
    (:mod:`prefixgate.proxy.observe.insight`).
    """
    counters = ProxyMetrics(policy_models(policy.routes))
    url = policy.ledger.redis_url  # shared state of replicas (cache.redis_link)
    link = RedisLink(url, policy.ledger.redis_prefix, registry=counters.registry) if url else None
    if sessions is None:
        sessions = SharedSessionStore(link) if link else MemorySessionStore()
    state = ProxyState(
        policy=policy,
        ledger=ledger if ledger is not None else open_ledger(policy.ledger),
        sessions=sessions,
        rewrite_fn=default_rewrite_fn() if rewrite_fn == "default" else rewrite_fn,  # type: ignore[arg-type]
        upstream=Upstream(transport),
        metrics=counters,
        insight=Insight(policy.ledger.store_prompt_text) if analyze else None,
        guard=Guard.from_policy(policy.auth, policy.ledger),
        otel=telemetry_from_env(policy),
        shared=RedisState(link) if link else LocalState(),
    )

    state.metrics.watch_resources(lambda: state.upstream.in_use, state.upstream.pool_stats,
                                  lambda: state.loop_lag.last_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.upstream.start()
        state.side = httpx.AsyncClient(transport=transport, follow_redirects=False)
        state.loop_lag.start()
        checks = None
        if policy.health_checks.interval_s > 0:
            assert state.breakers is not None
            checks = asyncio.create_task(health_check_loop(state.side, policy, state.breakers))
        try:
            yield
        finally:
            if checks is not None:
                checks.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checks
            await state.loop_lag.stop()
            await state.side.aclose()
            await state.upstream.close()
            state.ledger.flush()  # a batched writer's queued rows reach the disk
            if link is not None:
                await link.close()
            if state.otel is not None:
                await anyio.to_thread.run_sync(state.otel.shutdown)  # flush the batches

    # redirect_slashes=False: Starlette's slash redirect builds Location from the client's Host
    app = FastAPI(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None,
                  redirect_slashes=False)
    app.add_middleware(TrailingSlash)  # /v1/messages/ is served as /v1/messages, no redirect
    app.add_middleware(BarePaths)  # /chat/completions is served as /v1/chat/completions
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
        return JSONResponse(await list_models(state.side, state.policy))

    responses_api.install(app, state)  # /v1/responses (proxy.responses_api)
    passthrough.install(app, state)  # /v1/embeddings, /v1/completions, /v1/models/{id}
    count_tokens.install(app, state)  # /v1/messages/count_tokens

    @app.get("/healthz")  # open: no key (see proxy.auth)
    @app.head("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        # 503 + reasons past the thresholds of proxy.health, so a balancer stops sending first
        reasons, down = _health(state)
        body: dict[str, Any] = {"status": "degraded" if reasons else "ok", "reasons": reasons,
                                "backends": sorted(policy.backends), "down": down}
        return JSONResponse(body, status_code=503 if reasons else 200)

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
