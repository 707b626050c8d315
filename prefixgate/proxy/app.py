"""The proxy's HTTP surface: :func:`build_app` composes the packages into the FastAPI app.

It builds the shared state (:class:`~prefixgate.proxy.pipeline.exchange.ProxyState`), the lifespan
(upstream client, health checks, ledger flush), the exception handlers (every error in the
caller's shape) and installs the endpoints, each of which runs the one request pipeline
(:mod:`prefixgate.proxy.pipeline.run`: prepare -> send -> answer -> record):

- ``POST /v1/chat/completions``, ``POST /v1/messages`` (:mod:`prefixgate.proxy.api.chat`; a client
  whose API differs from its backend's goes through a bridge, :mod:`prefixgate.proxy.bridges`);
- the Responses API (:mod:`prefixgate.proxy.api.responses`); ``/v1/messages/count_tokens``
  (:mod:`prefixgate.proxy.api.count_tokens`); ``/v1/embeddings``, ``/v1/completions``
  (:mod:`prefixgate.proxy.api.passthrough`); ``GET /v1/models`` and ``/v1/models/{id}``
  (:mod:`prefixgate.proxy.api.models`); every API route also without ``/v1``
  (:mod:`prefixgate.proxy.http.middleware`); the two chat routes' POSTs skip the router
  (:mod:`prefixgate.proxy.http.lean`: same handlers, same errors);
- ``GET /healthz`` (``{"status": "ok" | "degraded", "reasons": [...], "backends": [...],
  "down": {deployment: why}}``, 503 when degraded, see :mod:`prefixgate.proxy.observe.health`; a
  deployment whose breaker is not closed is named in ``down`` without degrading the proxy, which
  still serves every other route; ``guard``: the meaning guard's verdicts counted by state, no
  route or tenant named — the endpoint is open), ``GET /api/savings``
  (:mod:`prefixgate.proxy.observe.savings_api`; its ``guard``: the caller's tenant's verdicts),
  ``GET /dashboard`` (:mod:`prefixgate.proxy.observe.dashboard`), ``GET /metrics``,
  ``GET /openapi.json`` (behind the proxy's keys when keys are configured, as every route but
  ``/healthz`` and ``/metrics``).

HEAD is served wherever GET is, by construction: :func:`_head_wherever_get` adds it to every
GET route once all are installed (a GET-only route answered HEAD with a 405, issue 20).

Any other path or method is a 404 / 405 in the caller's shape; a trailing slash is served, never
redirected. Response headers: ``x-prefixgate-edits`` (the rewrite summary, or ``off``),
``x-prefixgate-tokens-pruned``, ``x-prefixgate-edit-detail`` when the policy opts in
(:mod:`prefixgate.proxy.pipeline.edit_detail`), and ``x-prefixgate-cached-tokens`` on non-streamed
answers, and on streams whose backend reports cached tokens in its response headers (our
engine's ``X-Engine-Cached-Tokens``); other streams' headers leave before usage is known.
``x-prefixgate-span-reused-tokens`` likewise, where our engine reports the cached tokens it reused
across a changed span (issue 33).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.ledger.writer import open_ledger
from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.cache.state.session import MemorySessionStore, SessionStore
from prefixgate.cache.state.session_redis import SharedSessionStore
from prefixgate.cache.state.shared_state import LocalState, RedisState
from prefixgate.config.schema import Policy
from prefixgate.proxy.api import chat, count_tokens, models, passthrough
from prefixgate.proxy.api import responses as responses_api
from prefixgate.proxy.core import heap
from prefixgate.proxy.core.errors import (
    Api,
    InternalError,
    ProxyError,
    UnknownEndpoint,
    api_for_path,
    error_response,
)
from prefixgate.proxy.core.logsafe import safe
from prefixgate.proxy.http.auth import Guard
from prefixgate.proxy.http.lean import LeanRoutes
from prefixgate.proxy.http.middleware import BarePaths, TrailingSlash, doubled_prefix_hint
from prefixgate.proxy.http.tenants import salts, shared_cache_warnings, tenancy_possible
from prefixgate.proxy.observe import savings_api
from prefixgate.proxy.observe.dashboard import install as install_dashboard
from prefixgate.proxy.observe.insight import Insight
from prefixgate.proxy.observe.kv_events_metrics import KVEventsCollector
from prefixgate.proxy.observe.metrics import ProxyMetrics, label_vocabulary
from prefixgate.proxy.observe.otel import telemetry_from_env
from prefixgate.proxy.pipeline.exchange import ProxyState, access_log
from prefixgate.proxy.pipeline.guard_trial import meaning_guard_for
from prefixgate.proxy.pipeline.rewrite import (
    RewriteFn,
    default_rewrite_fn,
)
from prefixgate.proxy.routing.kv_events import KVEventHub
from prefixgate.proxy.routing.kv_shared import SharedKVIndex
from prefixgate.proxy.routing.pd.drive import link_state
from prefixgate.proxy.routing.probes import health_check_loop
from prefixgate.proxy.routing.router import Target, pick_target
from prefixgate.proxy.upstream.client import Upstream
from prefixgate.rewriter.analysis.tokens import warm_encodings

__all__ = ["ProxyState", "build_app", "route_for"]

log = logging.getLogger("prefixgate.proxy")


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

    ``ledger``: default :func:`prefixgate.cache.ledger.writer.open_ledger` (batched writer thread,
    flushed when the app stops); ``sessions``: default
    :class:`prefixgate.cache.state.session_redis.SharedSessionStore` when
    ``policy.ledger.redis_url`` is set, else in-process LRU; ``rewrite_fn``: the rewrite pipeline
    (default :func:`prefixgate.rewriter.pipeline.rewrite_request`; None = never rewrite);
    ``transport``: httpx transport for the upstream client (tests); ``analyze``: run the cache-break
    detector and the counterfactual cache model after each request
    (:mod:`prefixgate.proxy.observe.insight`).
    """
    counters = ProxyMetrics(label_vocabulary(policy))
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
        guard=Guard.from_policy(policy.auth, policy.ledger, link),
        otel=telemetry_from_env(policy),
        shared=RedisState(link) if link else LocalState(),
    )

    trials = meaning_guard_for(policy, state.shared, state.rewrite_fn, state.upstream.send)
    state.meaning_guard = trials
    _tenants_at_start(state)
    state.metrics.watch_resources(lambda: state.upstream.in_use, state.upstream.pool_stats,
                                  lambda: state.loop_lag.last_s)
    state.metrics.watch_ledger(state.ledger.state)  # spool / database reachability (issue 26)
    if trials is not None:  # trial events and verdicts by state (observe.metrics, issue 36)
        state.metrics.watch_guard(lambda: trials.counts, trials.state_counts)
    state.metrics.registry.register(KVEventsCollector(lambda: state.kv_events))

    @asynccontextmanager
    async def lifespan(started: FastAPI) -> AsyncIterator[None]:
        await state.upstream.start()
        state.side = httpx.AsyncClient(transport=transport, follow_redirects=False)
        state.loop_lag.start()
        hub = KVEventHub.from_policy(policy)
        if hub.streams and link is not None:  # shared with the other replicas (routing.kv_shared)
            hub.shared = SharedKVIndex(state.shared, dict(hub.streams))
        if hub.streams:
            state.kv_events = hub
            hub.start()
        if state.insight is not None:  # the after-answer analysis counts tokens from request 1
            threading.Thread(target=warm_encodings, name="warm-encodings", daemon=True).start()
        checks = None
        if policy.health_checks.interval_s > 0:
            assert state.breakers is not None
            checks = asyncio.create_task(health_check_loop(state.side, policy, state.breakers))
        if getattr(started.state, "freeze_startup", False):  # set by `prefixgate serve` (core.heap)
            heap.freeze_startup()
        try:
            yield
        finally:
            if checks is not None:
                checks.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checks
            await state.loop_lag.stop()
            if trials is not None:  # trials in flight are cancelled (their rows are written)
                await trials.close()
            await hub.stop()
            await state.side.aclose()
            await state.upstream.close()
            # a batched writer's queued rows reach the disk / the database (or its spool): this
            # is what SIGTERM runs (uvicorn's shutdown), off the loop, bounded for a hung store
            # (what is left then is spooled by the ledger's close, at exit)
            await anyio.to_thread.run_sync(state.ledger.flush, state.ledger.shutdown_s)
            await state.guard.drain()  # rate-limit token writes in flight reach Redis
            if link is not None:
                await link.close()
            if state.otel is not None:
                await anyio.to_thread.run_sync(state.otel.shutdown)  # flush the batches

    # redirect_slashes=False: Starlette's slash redirect builds Location from the client's Host;
    # openapi_url=None: /openapi.json is served below, behind the keys
    app = FastAPI(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    app.add_middleware(LeanRoutes, fastapi_app=app)  # innermost: the hot POSTs skip the router
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
        path = request.url.path
        hint = doubled_prefix_hint(path, str(request.base_url).rstrip("/")[:200]) if (
            exc.status_code == 404) else ""
        err = UnknownEndpoint(request.method, path, exc.status_code, hint)
        access_log.info("%s %s %d (no such endpoint)", request.method, safe(path), exc.status_code)
        return error_response(err, api_for_path(path), dict(exc.headers or {}))

    chat.install(app, state)  # /v1/chat/completions, /v1/messages
    models.install(app, state)  # /v1/models, /v1/models/{id}
    responses_api.install(app, state)  # /v1/responses (api.responses)
    passthrough.install(app, state)  # /v1/embeddings, /v1/completions
    count_tokens.install(app, state)  # /v1/messages/count_tokens

    @app.get("/healthz")  # open: no key (see http.auth)
    @app.head("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        # 503 + reasons past the thresholds of observe.health, so a balancer stops sending first
        reasons, down = _health(state)
        body: dict[str, Any] = {"status": "degraded" if reasons else "ok", "reasons": reasons,
                                "backends": sorted(policy.backends), "down": down}
        led = state.ledger.state()  # a shared ledger: reachable, or spooling (issue 26); a
        if state.ledger.kind != "sqlite" or led.get("error"):  # file degraded to memory (34)
            body["ledger"] = led  # informative, never a 503: requests go on
        pd_links = {name: link_state(b.pd) for name, b in sorted(policy.backends.items())
                    if b.pd is not None and b.pd.protocol == "vllm"}
        if pd_links:  # a P/D pair's KV link as its last prefill answer showed it: informative
            body["pd_links"] = pd_links
        if trials is not None:  # open endpoint: counts by state only, no route or tenant names
            body["guard"] = trials.state_counts()
        return JSONResponse(body, status_code=503 if reasons else 200)

    savings_api.install(app, state.ledger, policy, state.guard,
                        guard_verdicts=None if trials is None else trials.snapshot)

    @app.get("/metrics")  # open: no key (see http.auth)
    @app.head("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    install_dashboard(app, state.guard)  # GET /dashboard (observe.dashboard)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_document(request: Request) -> Response:
        await state.guard.admit(request.headers, "openai", limit=False)  # 401 when keys are on
        return JSONResponse(app.openapi())

    _head_wherever_get(app)
    return app


def _tenants_at_start(state: ProxyState) -> None:
    """Say at startup where tenants share a prefix cache (a warning per backend,
    :func:`prefixgate.proxy.http.tenants.shared_cache_warnings`), and read (or create) the salt
    secret when tenants will need it, so a problem is in the log and ``/healthz`` before the
    first request is refused (:mod:`prefixgate.proxy.http.salt_key`)."""
    policy = state.policy
    for line in shared_cache_warnings(policy, state.guard.store.keys()):
        log.warning("tenants: %s", line)
    if tenancy_possible(policy) and any(salts(b) for b in policy.backends.values()):
        assert state.salt_key is not None
        state.salt_key.key()


def _head_wherever_get(app: FastAPI) -> None:
    """Add a HEAD route (same handler, left out of the OpenAPI schema) for every GET route of
    ``app`` that has none; call once every route is installed. HEAD must answer as GET does,
    without a body (RFC 9110, section 9.3.2); FastAPI, unlike Starlette's ``Route``, does not
    add it itself."""
    routes = [r for r in app.router.routes if isinstance(r, APIRoute)]
    has_head = {r.path for r in routes if "HEAD" in r.methods}
    for r in routes:
        if "GET" in r.methods and r.path not in has_head:
            app.add_api_route(r.path, r.endpoint, methods=["HEAD"], include_in_schema=False)
            has_head.add(r.path)


def route_for(policy: Policy, model: str, api: Api) -> Target:
    """Where ``model`` would go for a client of ``api`` (for ``prefixgate report`` / tests)."""
    return pick_target(policy, model, api, can_translate=True)
