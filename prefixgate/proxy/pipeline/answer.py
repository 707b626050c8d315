"""The client's response from the upstream's, and the one mapping of failures to answers.

:func:`answer` relays an upstream response (closed on every path: by the relay for a stream,
here otherwise): the upstream's own 4xx / 5xx in the client's shape with its status and
``retry-after``; a stream event by event (:class:`~prefixgate.proxy.upstream.relay.StreamRelay`); a JSON
answer read, checked and mapped by the request's bridge. Whatever fails from the send on raises into
:func:`refuse`, the single place an exception becomes a shaped error and a recorded row: an
upstream failure after the send (:class:`~prefixgate.proxy.core.errors.UpstreamUnavailable` /
:class:`~prefixgate.proxy.core.errors.UpstreamTimeout` raised while answering) is ``upstream_error``; one
before any answer is named by its class; a bug is InternalError (500); a cancellation is recorded as
``client_disconnect`` and re-raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import orjson
from starlette.responses import Response

from prefixgate.proxy.core.engine_timings import engine_timings
from prefixgate.proxy.core.errors import (
    ClientDisconnected,
    InternalError,
    ProxyError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_response,
    upstream_error_body,
    upstream_error_kind,
)
from prefixgate.proxy.core.usage import Usage, usage_from_headers
from prefixgate.proxy.http.headers import downstream_headers
from prefixgate.proxy.observe.insight import Analysis, partition_key
from prefixgate.proxy.pipeline.after_answer import AfterResponse
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.record import finish, merge_memory, remember_answer_id
from prefixgate.proxy.upstream.client import ERROR_BODY_MAX_BYTES, JSON, read_at_most
from prefixgate.proxy.upstream.relay import SSE_HEADERS, SSEResponse, StreamRelay

# Bodies above this (base64 images, B19) skip the break / counterfactual analysis: counting
# tokens of megabytes of base64 costs ~0.25 s per MB and says nothing about the text prefix.
ANALYZE_MAX_BYTES = 1 << 20
# Bodies up to this size are analysed on the event loop once their model's token counter is
# loaded (observe.insight.Insight.analyze ``inline``): the thread hop costs more than the work.
INLINE_ANALYZE_BYTES = 4096


class AnswerFailed(Exception):
    """An upstream failure while answering (after the response head): ``error`` is what the
    client is told; the row's status is ``upstream_error``."""

    def __init__(self, error: ProxyError, why: str) -> None:
        super().__init__(why)
        self.error, self.why = error, why


def refuse(state: ProxyState, ex: Exchange, e: BaseException) -> Response:
    """The shaped error for an exception raised before the answer (see module docstring),
    recorded; a cancellation is recorded as ``client_disconnect`` and re-raised."""
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


async def answer(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """The client's response from ``resp`` (see module docstring)."""
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
        if isinstance(e, AnswerFailed):
            ex.row.error = e.why
            response = error_response(e.error, ex.api)
            await finish(state, ex, Usage(), "upstream_error", response.status_code)
            return response
        return refuse(state, ex, e)


def _ours(ex: Exchange, resp: httpx.Response) -> dict[str, str]:
    """The proxy's own response headers, and the upstream's that the client gets."""
    assert ex.rw is not None
    ex.reported = engine_timings(resp.headers)
    out = downstream_headers(resp.headers)
    if ex.rw.summary:  # an endpoint the passes apply to says what they did
        out.update({"x-prefixgate-edits": ex.rw.summary,
                    "x-prefixgate-tokens-pruned": str(ex.rw.pruned), **(ex.obs.headers or {})})
    early = usage_from_headers(resp.headers)  # engines that report usage in headers
    out.update(usage_headers(early))
    return out


def usage_headers(usage: Usage) -> dict[str, str]:
    """``x-prefixgate-cached-tokens`` and, where our engine reported one (issue 33),
    ``x-prefixgate-span-reused-tokens`` (of the cached tokens, those reused across a changed
    span): what every client API sees of them, whatever its usage object can carry."""
    out = {}
    if usage.cached_tokens is not None:
        out["x-prefixgate-cached-tokens"] = str(usage.cached_tokens)
    if usage.span_reused_tokens is not None:
        out["x-prefixgate-span-reused-tokens"] = str(usage.span_reused_tokens)
    return out


def _is_json_object(raw: bytes) -> bool:
    try:
        return isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        return False


async def _upstream_error(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """The upstream's own 4xx / 5xx, passed through with its status, its ``retry-after`` and
    rate-limit headers, and its body in the client's shape."""
    assert ex.bridge is not None
    try:
        err = await read_at_most(resp, ERROR_BODY_MAX_BYTES)
    except httpx.HTTPError:
        err = b""
    finally:
        await resp.aclose()
    kind = upstream_error_kind(err)  # the upstream's own words, e.g. context_length_exceeded
    media = resp.headers.get("content-type", JSON)
    if not _is_json_object(err):  # an HTML page, an empty body: put in the caller's shape
        err, media = orjson.dumps(upstream_error_body(err, resp.status_code, ex.api)), JSON
    else:
        mapped = ex.bridge.error(err, resp.status_code)
        if mapped is not None:
            err, media = mapped, JSON
    ex.row.error = f"upstream {resp.status_code}" + (f" {kind}" if kind else "")
    response = Response(err, status_code=resp.status_code, headers=_ours(ex, resp),
                        media_type=media)
    await finish(state, ex, Usage(), "upstream_error", response.status_code)
    return response


def _analyzer(state: ProxyState, ex: Exchange) -> Callable[[], Awaitable[Analysis]]:
    """The after-answer analysis of this request (cache breaks, counterfactual from the
    backend's own token ids where it tokenizes, :mod:`prefixgate.proxy.observe.insight`)."""
    async def analyze() -> Analysis:
        if state.insight is None or not ex.endpoint.analyze:
            return Analysis()
        assert ex.target is not None and ex.rw is not None
        if len(ex.raw) > ANALYZE_MAX_BYTES or state.record_order.shed_analysis():
            state.insight.note_gap(partition_key(ex.target))  # too large / behind under load
            return Analysis()
        return await state.insight.analyze(
            state.upstream, ex.target, api=ex.api, session=ex.row.session, model=ex.row.model,
            original=ex.body, sent=ex.rw.body, budget_ms=state.policy.rewrite.time_budget_ms,
            max_depth=state.policy.limits.max_json_depth,
            inline=len(ex.raw) <= INLINE_ANALYZE_BYTES, tenant=ex.row.tenant,
            view=ex.pass_view, ctx=ex.ctx, recorded=ex.rw.stages)
    return analyze


def _deadline(ex: Exchange) -> float | None:
    """The loop time by which the whole answer must be in (backend ``timeouts.total_s``)."""
    assert ex.target is not None
    total = ex.target.backend.timeouts_s()[3]
    return None if total is None else asyncio.get_running_loop().time() + total


async def _stream(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """Hand ``resp`` to a :class:`StreamRelay`; from here it closes it."""
    assert ex.target is not None and ex.watcher is not None
    ctype = resp.headers.get("content-type", "")
    if not ctype.startswith("text/event-stream"):
        raise AnswerFailed(UpstreamUnavailable(
            f"upstream {ex.target.backend_name!r} answered a streamed request with "
            f"{ctype.split(';')[0] or 'no content type'} instead of an event stream"),
            "not an SSE stream")
    ex.watcher.usage.merge(usage_from_headers(resp.headers))
    watcher, analyze, bridge = ex.watcher, _analyzer(state, ex), ex.bridge
    announced = state.ledger.announced if ex.endpoint.ledger else None
    order: list[Any] = []  # [announce token, previous answer's event, this answer's]

    async def before_end() -> None:  # before the stream's final message (upstream.relay)
        remember_answer_id(ex, getattr(watcher, "message_id", "")  # cache diagnostics' baseline
                           or getattr(watcher, "response_id", ""))
        await merge_memory(state, ex)  # the session's next turn reads it
        token = announced.announce() if announced is not None else 0  # readers wait for it
        order.extend((token, *state.record_order.turn()))  # rows in the order of their answers

    async def on_end(status: str, http_status: int) -> None:  # once the client has it all
        try:
            if bridge is not None:
                bridge.stream_done(watcher, status)
            prev = order[1] if order else None
            await finish(state, ex, watcher.usage, status, http_status, analyze,
                         gate=lambda: state.record_order.wait(prev))
        finally:
            if order:
                order[2].set()
                if announced is not None:
                    announced.settle(order[0])

    _, _, idle, _ = ex.target.backend.timeouts_s()
    read = max(ex.target.backend.timeouts_s()[1], idle)
    relay = StreamRelay(resp, watcher, ex.timing, on_end, ex.mapper, ex.api,
                        idle_s=idle if idle < read else None, deadline=_deadline(ex),
                        end_mapper=ex.end_mapper, before_end=before_end)
    return SSEResponse(relay, headers={**_ours(ex, resp), **SSE_HEADERS})


async def _json_answer(state: ProxyState, ex: Exchange, resp: httpx.Response) -> Response:
    """Read, check and (bridged) translate a non-streamed answer; 502 when it broke off or
    cannot be read, 504 past the total timeout."""
    assert ex.target is not None and ex.bridge is not None
    headers = _ours(ex, resp)
    deadline = _deadline(ex)
    try:
        async with asyncio.timeout_at(deadline):
            content = await resp.aread()
        parsed = ex.bridge.loads(content)
        if not isinstance(parsed, dict):
            raise TypeError("answer is not a JSON object")
        model = parsed.get("model")
        ex.obs.response_model = model[:200] if isinstance(model, str) else None
        content, from_answer = ex.bridge.answer(parsed, content, ex.row.model)
        usage = usage_from_headers(resp.headers)
        usage.merge(from_answer)  # the answer's own usage wins over the headers
    except TimeoutError:
        raise AnswerFailed(UpstreamTimeout(f"upstream {ex.target.backend_name!r} did not finish "
                                           "its answer within the total timeout"),
                           "total timeout") from None
    except (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        # the body broke off, is not a JSON object, or has a shape the bridge cannot translate
        raise AnswerFailed(UpstreamUnavailable(
            f"upstream {ex.target.backend_name!r} broke off or sent an unreadable answer"),
            type(e).__name__) from None
    finally:
        await resp.aclose()
    ex.timing.end = time.perf_counter()
    headers.update(usage_headers(usage))
    remember_answer_id(ex, parsed.get("id"))  # the cache diagnostics' next baseline
    await merge_memory(state, ex)  # before the answer: the session's next turn reads it
    status = resp.status_code
    announced = state.ledger.announced if ex.endpoint.ledger else None
    token = announced.announce() if announced is not None else 0  # readers wait for the row
    prev, mine = state.record_order.turn()  # rows in the order of their answers

    async def after() -> None:  # the row, breaks, counterfactual: once the answer is out
        try:
            await finish(state, ex, usage, "ok", status, _analyzer(state, ex),
                         gate=lambda: state.record_order.wait(prev))
        finally:
            mine.set()
            if announced is not None:
                announced.settle(token)

    return AfterResponse(content, after=after, status_code=status, headers=headers,
                         media_type=resp.headers.get("content-type", JSON))
