"""Plain pass-through endpoints: ``POST /v1/embeddings`` and ``POST /v1/completions`` (legacy,
stream too).

Routed like chat (the policy's first matching model glob), sent to the backend's
``base_url/embeddings`` / ``/completions`` with its own key, answered as the backend answered
(status, body, rate-limit headers), one ledger row per request (prompt / output tokens from the
answer's ``usage``; a stream's from its usage chunk, or its deltas). No rewrite pass applies:
neither body has a prefix structure to stabilise. A route whose backend speaks the Anthropic
API is a 501 (Anthropic has neither endpoint). ``/v1/completions`` without ``max_tokens`` gets
the route's default cap (:mod:`prefixgate.proxy.pipeline.output_cap`).

:class:`SideCall` carries one such request from read to record; :mod:`prefixgate.proxy.api.count_tokens` uses
its reading half too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from prefixgate.cache.counterfactual import measured_counterfactual
from prefixgate.cache.ledger import LedgerRow
from prefixgate.proxy.bridges import translate
from prefixgate.proxy.core.errors import (
    Api,
    InternalError,
    InvalidRequest,
    NotSupported,
    ProxyError,
    UpstreamUnavailable,
    error_response,
    upstream_error_body,
)
from prefixgate.proxy.core.usage import OpenAIStreamWatcher, Usage, usage_from_answer
from prefixgate.proxy.http import body as wire
from prefixgate.proxy.http.body import check_nesting, read_body_within
from prefixgate.proxy.http.headers import downstream_headers, upstream_headers
from prefixgate.proxy.http.tenants import salted_body, tenant_for
from prefixgate.proxy.pipeline.output_cap import route_cap
from prefixgate.proxy.routing.router import Target, pick_target
from prefixgate.proxy.upstream.client import read_at_most, send_unless_gone
from prefixgate.proxy.upstream.relay import SSE_HEADERS, SSEResponse, StreamRelay, Timing

JSON = "application/json"
ERROR_BODY_MAX_BYTES = 1 << 20


@dataclass
class SideCall:
    """One pass-through request: its ledger ``row``, ``timing``, parsed ``body`` / ``raw``."""

    state: Any
    request: Request
    api: Api
    row: LedgerRow
    timing: Timing = field(default_factory=Timing)
    body: dict[str, Any] = field(default_factory=dict)
    raw: bytes = b""
    target: Target | None = None
    ledger: bool = True  # False: not a model call, no ledger row (count_tokens)

    async def read(self) -> None:
        """Auth (401 / 429), the tenant (400 for a malformed tenant header), body under the
        limits (400 / 408 / 413), ``model`` a string,
        ``stream`` a boolean; then route (404 / 501 for the other API's backend)."""
        policy = self.state.policy
        self.row.key_id = await self.state.guard.admit(self.request.headers, self.api)
        self.row.tenant = tenant_for(self.request.headers, self.row.key_id, policy,
                                     self.state.guard)
        self.raw = await read_body_within(self.request, policy.max_body_bytes,
                                          policy.limits.body_timeout_s)
        self.body = wire.parse_json(self.raw)
        await check_nesting(self.body, policy.limits.max_json_depth, len(self.raw))
        if not isinstance(self.body.get("model"), str):
            raise InvalidRequest("Missing or invalid 'model': expected a string.", param="model",
                                 code="missing_required_parameter")
        stream = self.body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise InvalidRequest("Invalid type for 'stream': expected a boolean.", param="stream",
                                 code="invalid_type")
        self.row.model, self.row.stream = self.body["model"], stream is True
        self.target = pick_target(policy, self.row.model, self.api, can_translate=True)
        self.row.route, self.row.backend = self.target.route, self.target.backend_name

    def record(self, usage: Usage, status: str, http_status: int, deltas: int = 0) -> None:
        """Write the ledger row (once per request; never when ``ledger`` is False)."""
        if not self.ledger:
            return
        row = self.row
        row.prompt_tokens, row.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        row.output_tokens = usage.output_tokens if usage.output_tokens is not None else (
            deltas or None)
        row.ttft_ms, row.tpot_ms = self.timing.ttft_ms(), self.timing.tpot_ms(row.output_tokens)
        row.total_ms = self.timing.total_ms()
        row.status, row.http_status = status, http_status
        measured_counterfactual(row)
        self.state.record(row)

    def refuse(self, e: BaseException) -> Response:
        """The shaped error for ``e``, recorded; a cancellation is recorded and re-raised."""
        if not isinstance(e, Exception):
            self.row.error = type(e).__name__
            self.record(Usage(), "client_disconnect", 499)
            raise e
        exc = e if isinstance(e, ProxyError) else InternalError.wrap(e)
        response = error_response(exc, self.api)
        self.row.error = exc.message[:200]
        self.record(Usage(), type(exc).__name__, response.status_code)
        return response

    async def send(self, url: str, raw: bytes) -> httpx.Response:
        """Send ``raw`` to ``url`` with the backend's key (502 / 504; 499 if the client goes)."""
        assert self.target is not None
        headers = upstream_headers(self.request.headers.items(), self.target.backend,
                                   self.target.api_key())
        send = self.state.upstream.send(url, headers, raw, self.target.backend.timeout_s)
        return await send_unless_gone(send, self._client_gone)

    async def _client_gone(self) -> None:
        while (await self.request.receive())["type"] != "http.disconnect":
            await anyio.sleep(0.05)

    async def answer(self, resp: httpx.Response) -> Response:
        """Relay ``resp`` (closed on every path): an error with its status, a stream event by
        event, a JSON body as is; record the row."""
        try:
            if resp.status_code >= 400:
                return await self.error(resp)
            if self.row.stream:
                return self._stream(resp)
            return await self._json(resp)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            raise

    async def error(self, resp: httpx.Response) -> Response:
        """The upstream's own error (``resp`` closed): its status and rate-limit headers, its
        body in the caller's shape (bridged from the backend's API when they differ)."""
        assert self.target is not None
        try:
            err = await read_at_most(resp, ERROR_BODY_MAX_BYTES)
        except httpx.HTTPError:
            err = b""
        finally:
            await resp.aclose()
        try:
            ok = isinstance(orjson.loads(err), dict)
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            err = orjson.dumps(upstream_error_body(err, resp.status_code, self.api))
        elif self.target.translate:
            err = orjson.dumps(translate.error(self.api, err, resp.status_code))
        self.row.error = f"upstream {resp.status_code}"
        self.record(Usage(), "upstream_error", resp.status_code)
        return Response(err, status_code=resp.status_code, media_type=JSON,
                        headers=downstream_headers(resp.headers))

    async def _json(self, resp: httpx.Response) -> Response:
        assert self.target is not None
        try:
            content = await resp.aread()
            usage = usage_from_answer(orjson.loads(content), self.target.wire)
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            self.row.error = type(e).__name__
            response = error_response(UpstreamUnavailable(
                f"upstream {self.target.backend_name!r} broke off or sent an unreadable answer"),
                self.api)
            self.record(Usage(), "upstream_error", response.status_code)
            return response
        finally:
            await resp.aclose()
        self.timing.end = time.perf_counter()
        self.record(usage, "ok", resp.status_code)
        return Response(content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type", JSON),
                        headers=downstream_headers(resp.headers))

    def _stream(self, resp: httpx.Response) -> Response:
        watcher = OpenAIStreamWatcher()

        async def on_end(status: str, http_status: int) -> None:
            self.record(watcher.usage, status, http_status, watcher.deltas)

        relay = StreamRelay(resp, watcher, self.timing, on_end, None, self.api)
        return SSEResponse(relay, headers={**downstream_headers(resp.headers), **SSE_HEADERS})


async def _pass(state: Any, request: Request, path: str) -> Response:
    """``POST /v1/<path>`` passed through to the routed backend (module docstring)."""
    call = SideCall(state, request, "openai", LedgerRow(endpoint=request.url.path))
    try:
        await call.read()
        assert call.target is not None
        if call.target.wire != "openai":
            raise NotSupported(f"model '{call.row.model}' routes to backend "
                               f"'{call.target.backend_name}' (anthropic), which has no "
                               f"/{path} endpoint", param="model")
        raw = call.raw
        cap = route_cap(state.policy, call.target)
        if path == "completions" and cap > 0 and call.body.get("max_tokens") is None:
            raw = orjson.dumps({**call.body, "max_tokens": cap})
        if path == "completions":  # the tenant's prefix-cache namespace (proxy.tenants)
            raw = salted_body(raw, call.row.tenant, call.target.backend)
        resp = await call.send(f"{call.target.backend.base_url}/{path}", raw)
    except BaseException as e:
        return call.refuse(e)
    return await call.answer(resp)


def install(app: FastAPI, state: Any) -> None:
    """Add the pass-through routes to ``app``."""
    async def embeddings(request: Request) -> Response:
        return await _pass(state, request, "embeddings")

    async def completions(request: Request) -> Response:
        return await _pass(state, request, "completions")

    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
