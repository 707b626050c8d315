"""The engine's OpenAI-compatible HTTP server (FastAPI), same API as vLLM / SGLang.

Routes::

    POST /v1/chat/completions   chat (stream and non-stream, tools -> tool_calls; a forcing
                                tool_choice / allowed_tools binds: tool_mask.py, constrained.py)
    POST /v1/completions        raw prompt (string or token ids)
    GET  /v1/models             {"object": "list", "data": [{"id": <model>, ...}]}
    POST /tokenize              vLLM's: prompt or messages (+ tools) -> {"tokens", "count",
                                "max_model_len"}, the ids generation would prefill (no KV work)
    POST /detokenize            {"tokens": [...]} -> {"prompt": text}
    POST /v1/cache/match        a chat body, or {"input_ids": [...], "cache_salt"?} ->
                                {"cached_tokens", "prompt_tokens"}: the prompt's prefix the
                                radix tree holds now, read-only (for a cache-aware router)
    POST /reset_prefix_cache    vLLM's: empty the radix tree when no request holds part of it
                                ({"reset": bool}; KV event consumers get AllBlocksCleared)
    GET  /health                {"status": "ok"} (+ "kv_link": {"role", "up", "pairings",
                                "repairs"} on a P/D role: 200 while unpaired, requests recompute)
    GET  /metrics               Prometheus text (see metrics.py)

A request's path: parse JSON -> validate (protocol.py) -> sampling checks, then render, size
check and tokenize in a worker thread, then the context check (jobs.py) -> ``engine.generate``
-> answer JSON or SSE (``chunks.py`` builds the bodies). Errors leave as OpenAI's
``{"error": {...}}`` with a 4xx (``ApiError``). A client that disconnects aborts its engine
request, so its KV slots are freed at once. Answers carry ``X-Engine-TTFT-Ms`` (server-side
TTFT: arrival -> first token, ms) split into ``X-Engine-Queue-Ms`` (arrival -> first scheduled
in a forward step) and ``X-Engine-Prefill-Ms`` (first scheduled -> first token),
``X-Engine-Prompt-Tokens`` and ``X-Engine-Cached-Tokens`` headers — on streams too, since the
response starts only once the first token exists — and non-streamed answers
``X-Engine-Decode-Ms`` (first -> last token). On a P/D decode instance, prompt tokens whose KV
the transfer brought are no cache hits: they leave ``cached_tokens`` and the cached header and
are reported apart (``usage.prompt_tokens_details.kv_transfer_tokens``,
``X-Engine-Transfer-Tokens``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from prefixgate.local_engine.engine import Engine, PromptTooLong, RequestOutput
from prefixgate.local_engine.server.chunks import (
    DONE,
    ChatChunks,
    ChatStreamWriter,
    CompletionChunks,
    CompletionStreamWriter,
    chat_message,
    sse,
    usage_dict,
)
from prefixgate.local_engine.server.jobs import Job, chat_job, completion_job
from prefixgate.local_engine.server.metrics import CONTENT_TYPE, EngineMetrics, stats_log_line
from prefixgate.local_engine.server.pd_handoff import PDHandoff, PDRequest
from prefixgate.local_engine.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)
from prefixgate.local_engine.server.tokenize import (
    PromptLimit,
    context_error,
    detokenize,
    match_ids,
    max_token_bytes,
    tokenize,
)

__all__ = ["build_app"]

log = logging.getLogger("local_engine.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
HDR_TTFT_MS = "X-Engine-TTFT-Ms"
HDR_DECODE_MS = "X-Engine-Decode-Ms"  # non-streamed answers: first -> last token, ms
HDR_QUEUE_MS = "X-Engine-Queue-Ms"  # arrival -> first scheduled, ms
HDR_PREFILL_MS = "X-Engine-Prefill-Ms"  # first scheduled -> first token, ms
HDR_PROMPT_TOKENS = "X-Engine-Prompt-Tokens"
HDR_CACHED_TOKENS = "X-Engine-Cached-Tokens"
HDR_TRANSFER_TOKENS = "X-Engine-Transfer-Tokens"  # P/D: prompt tokens whose KV came over the link


@dataclass
class _Timing:
    """Token timestamps of one request (perf_counter seconds) for TTFT / TPOT."""

    received: float
    first: float | None = None
    last: float | None = None

    def tick(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now


class _Server:
    """Route handlers bound to one engine and its metrics."""

    def __init__(self, engine: Engine, pd: PDHandoff | None = None) -> None:
        self.engine = engine
        self.pd = pd if pd is not None else PDHandoff()
        self.metrics = EngineMetrics(lambda: engine.stats() | self.pd.stats())
        self.limit = PromptLimit(engine.max_context_len, max_token_bytes(engine.tokenizer))

    # ---- engine stream -------------------------------------------------------------------

    async def _outputs(
        self, job: Job, timing: _Timing
    ) -> AsyncGenerator[RequestOutput, None]:
        """The engine's outputs for ``job``; records metrics when it finishes."""
        last: RequestOutput | None = None
        try:
            async for out in self.engine.generate(
                job.prompt_ids, job.params, extra_key=job.extra_key, request_id=job.request_id,
                given_ids=job.given_ids,
            ):
                if out.new_token_ids:
                    timing.tick()
                last = out
                yield out
        except PromptTooLong:
            param = "messages" if job.kind == "chat" else "prompt"
            raise context_error(self.engine.max_context_len, len(job.prompt_ids), param) from None
        finally:
            if last is None or not last.finished:
                self.engine.abort(job.request_id)
            self._observe(timing, last)
            if last is not None:
                self.pd.record(last.prompt_tokens, last.cached_tokens, job.external_tokens)

    def _observe(self, timing: _Timing, last: RequestOutput | None) -> None:
        n = last.completion_tokens if last else 0
        ttft = timing.first - timing.received if timing.first is not None else None
        tpot = None
        if timing.first is not None and timing.last is not None and n > 1:
            tpot = (timing.last - timing.first) / (n - 1)
        reason = (last.finish_reason if last and last.finished else None) or "abort"
        self.metrics.observe_request(
            ttft_s=ttft, tpot_s=tpot, e2e_s=time.perf_counter() - timing.received,
            completion_tokens=n, finish_reason=str(reason),
        )

    async def _watch_disconnect(self, request: Request, job: Job) -> None:
        """Abort the engine request as soon as the client goes away."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.engine.abort(job.request_id)
                return

    # ---- answers -------------------------------------------------------------------------

    async def respond(self, request: Request, job: Job) -> Response:
        """Start ``job`` and wait for its first output, so that engine errors still become a
        4xx; then answer JSON (non-stream) or an SSE stream of the rest. P/D requests
        (``kv_transfer_params``) go through ``pd_handoff``: the decode side claims its KV import
        first, the prefill side exports its KV after and answers with the transfer's params."""
        pd = self.pd.parse(job.extra)
        if pd is not None and pd.kind == "prefill" and job.stream:
            raise ApiError("A prefill request (do_remote_decode) must have stream false.",
                           param="stream", code="invalid_value")
        pending = await self.pd.before(pd, job.prompt_ids, job.extra_key)
        job.external_tokens = pending.new_tokens if pending is not None else 0
        job.given_ids = list(pd.first_token_ids) if pd is not None and pd.kind == "decode" else None
        peer = self.pd.ask_peer(pd, job.prompt_ids, job.extra_key)  # overlaps the prefill
        timing = _Timing(received=job.received)
        watcher = asyncio.create_task(self._watch_disconnect(request, job))
        outputs = self.pd.hold(pending, self._outputs(job, timing))
        try:
            first = await anext(outputs)
        except ValueError as exc:  # the engine's own input checks (ids, params)
            watcher.cancel()
            await outputs.aclose()
            if peer is not None:
                peer.cancel()
            raise ApiError(str(exc), param=getattr(exc, "param", None),
                           code="invalid_value") from None
        except BaseException:
            watcher.cancel()
            await outputs.aclose()
            if peer is not None:
                peer.cancel()
            raise
        headers = _engine_headers(job, timing, first)
        if job.stream:
            return StreamingResponse(
                self._stream(job, first, outputs, watcher),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **headers},
            )
        text = [first.text_delta]
        ids = list(first.new_token_ids)
        last = first
        try:
            async for out in outputs:
                text.append(out.text_delta)
                ids.extend(out.new_token_ids)
                last = out
        finally:
            watcher.cancel()
        if timing.first is not None and timing.last is not None:  # decode: first -> last token
            headers[HDR_DECODE_MS] = f"{(timing.last - timing.first) * 1000.0:.1f}"
        body = self._final_body(job, "".join(text), last)
        await self._kv_params(body, pd, job, peer, last, ids)
        return _json(body, headers=headers)

    async def _kv_params(self, body: dict[str, Any], pd: PDRequest | None, job: Job,
                         peer: asyncio.Task[int] | None, last: RequestOutput,
                         ids: list[int]) -> None:
        """A prefill answer's ``kv_transfer_params`` (``pd_handoff.PDHandoff.after``, with the
        tokens it sampled); an aborted prefill exports nothing."""
        if pd is None:
            return
        if pd.kind == "prefill" and last.finished and last.finish_reason != "abort":
            body["kv_transfer_params"] = await self.pd.after(pd, job.prompt_ids, job.extra_key,
                                                             peer, ids)
        else:
            if peer is not None:
                peer.cancel()
            body["kv_transfer_params"] = None

    def _final_body(self, job: Job, text: str, last: RequestOutput) -> dict[str, Any]:
        model = self.engine.model_name
        usage = usage_dict(last, job.external_tokens)
        if job.kind == "completion":
            chunks = CompletionChunks(job.request_id, job.created, model)
            return chunks.full(text, last.finish_reason, usage)
        message, reason = chat_message(text, last.finish_reason, job.parse_tools)
        return ChatChunks(job.request_id, job.created, model).full(message, reason, usage)

    async def _stream(
        self,
        job: Job,
        first: RequestOutput,
        outputs: AsyncGenerator[RequestOutput, None],
        watcher: asyncio.Task[None],
    ) -> AsyncIterator[bytes]:
        model = self.engine.model_name
        writer: ChatStreamWriter | CompletionStreamWriter
        if job.kind == "chat":
            chat = ChatChunks(job.request_id, job.created, model, job.include_usage)
            writer = ChatStreamWriter(chat, job.parse_tools)
        else:
            comp = CompletionChunks(job.request_id, job.created, model, job.include_usage)
            writer = CompletionStreamWriter(comp)
        last = first
        try:
            for event in writer.start() + writer.feed(first.text_delta):
                yield event
            async for out in outputs:
                last = out
                for event in writer.feed(out.text_delta):
                    yield event
        except Exception as exc:
            log.exception("generation failed mid-stream")
            yield sse(_server_error(exc).body())
            yield DONE
            return
        finally:
            watcher.cancel()
            await outputs.aclose()
        for event in writer.close(last.finish_reason, usage_dict(last, job.external_tokens)):
            yield event

    # ---- routes --------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        received = time.perf_counter()
        req = parse_request(ChatCompletionRequest, await _json_body(request))
        job = await chat_job(self.engine, self.limit, req)
        job.received = received
        return await self.respond(request, job)

    async def completions(self, request: Request) -> Response:
        received = time.perf_counter()
        req = parse_request(CompletionRequest, await _json_body(request))
        job = await completion_job(self.engine, self.limit, req)
        job.received = received
        return await self.respond(request, job)

    async def tokenize(self, request: Request) -> Response:
        payload = await _json_body(request)
        return _json(await asyncio.to_thread(tokenize, self.engine.tokenizer,
                                             self.engine.max_context_len, payload, self.limit))

    async def detokenize(self, request: Request) -> Response:
        payload = await _json_body(request)
        return _json(await asyncio.to_thread(detokenize, self.engine.tokenizer, payload))

    async def cache_match(self, request: Request) -> dict[str, int]:
        """``POST /v1/cache/match`` (see module docstring). Read-only: no node split, no LRU
        time touched, no ``lock_ref`` (:meth:`RadixCache.peek_prefix_len`). It reads the tree
        while the engine thread may be changing it, so the answer is a routing hint: exact
        when the engine is idle, possibly short by what is being inserted or evicted now."""
        body = await _json_body(request)
        if isinstance(body, dict) and isinstance(body.get("input_ids"), list):
            ids, key = await asyncio.to_thread(match_ids, self.engine.tokenizer, body)
        else:
            job = await chat_job(self.engine, self.limit, parse_request(ChatCompletionRequest, body))
            ids, key = job.prompt_ids, job.extra_key
        cache = self.engine.cache
        try:
            cached = 0 if cache is None else cache.peek_prefix_len(ids, key)
        except (AttributeError, KeyError, IndexError, TypeError):  # a node changing under us
            cached = 0
        return {"cached_tokens": cached, "prompt_tokens": len(ids)}

    async def reset_prefix_cache(self) -> dict[str, bool]:
        """``POST /reset_prefix_cache``: ``{"reset": true}`` when the tree was emptied, false
        while a request holds part of it."""
        return {"reset": await asyncio.to_thread(self.engine.reset_prefix_cache)}

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{
                "id": self.engine.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "prefixgate",
                "max_model_len": self.engine.max_context_len,
            }],
        }


async def _json_body(request: Request) -> Any:
    """The decoded JSON body. Errors: ApiError(400, code ``invalid_json``); ApiError(499, code
    ``client_disconnect``) when the client goes away before the body is complete (nginx's
    "client closed request"; nobody reads it, but it is no engine failure)."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ApiError("The client went away before sending its whole request body.",
                       status=499, code="client_disconnect") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly.)",
            code="invalid_json",
        ) from None


def _server_error(exc: BaseException) -> ApiError:
    """OpenAI's 500 shape for an engine failure (the message names the exception type only:
    no prompt text leaks into errors)."""
    return ApiError(f"The engine failed to generate: {type(exc).__name__}.", status=500,
                    type="server_error", code="engine_error")


def _json(body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


def _engine_headers(job: Job, timing: _Timing, first: RequestOutput) -> dict[str, str]:
    """What the engine knows once the first token exists, as response headers (sent before
    the stream body): server-side TTFT (ms, request arrival -> first token) and its two parts,
    queue (arrival -> first scheduled) and prefill (first scheduled -> first token), prompt
    tokens and prompt tokens served from the radix cache."""
    moved = max(0, min(job.external_tokens, first.cached_tokens))  # P/D: not cache hits
    headers = {
        HDR_PROMPT_TOKENS: str(first.prompt_tokens),
        HDR_CACHED_TOKENS: str(first.cached_tokens - moved),
    }
    if moved:
        headers[HDR_TRANSFER_TOKENS] = str(moved)
    if timing.first is not None:
        headers[HDR_TTFT_MS] = f"{(timing.first - job.received) * 1000.0:.1f}"
        if first.scheduled_at is not None:
            queue = max(0.0, first.scheduled_at - job.received)
            prefill = max(0.0, timing.first - max(first.scheduled_at, job.received))
            headers[HDR_QUEUE_MS] = f"{queue * 1000.0:.1f}"
            headers[HDR_PREFILL_MS] = f"{prefill * 1000.0:.1f}"
    return headers


async def _log_stats(engine: Engine, interval_s: float) -> None:
    """Every ``interval_s`` seconds while the engine has work (or just finished some), log
    SGLang's status line (``metrics.stats_log_line``)."""
    was_busy = False
    while True:
        await asyncio.sleep(interval_s)
        stats = engine.stats()
        busy = bool(stats.get("num_running") or stats.get("num_waiting"))
        if busy or was_busy:
            log.info("%s", stats_log_line(stats))
        was_busy = busy


def build_app(engine: Engine, log_stats_interval_s: float | None = None,
              pd: PDHandoff | None = None) -> FastAPI:
    """The FastAPI app serving ``engine`` (routes: module docstring). The engine's lifetime is
    the caller's: the app never shuts it down. ``log_stats_interval_s`` (seconds): log the
    engine's status line at that period while it is busy (None: never). ``pd``: the P/D role's
    hooks (``server/pd_handoff.py``; None: colocated, role ``both``)."""
    server = _Server(engine, pd)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = None
        if log_stats_interval_s:
            task = asyncio.create_task(_log_stats(engine, log_stats_interval_s))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()

    app = FastAPI(title="prefixgate local engine", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "method_not_allowed" \
            if exc.status_code == 405 else "http_error"
        err = ApiError(f"{exc.detail}: {request.method} {request.url.path}.",
                       status=exc.status_code, code=code)
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        err = _server_error(exc)
        return JSONResponse(err.body(), status_code=500)

    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/tokenize", server.tokenize, methods=["POST"])
    app.add_api_route("/detokenize", server.detokenize, methods=["POST"])
    app.add_api_route("/v1/cache/match", server.cache_match, methods=["POST"])
    app.add_api_route("/reset_prefix_cache", server.reset_prefix_cache, methods=["POST"])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        link = server.pd.link_health()
        return {"status": "ok"} if link is None else {"status": "ok", "kv_link": link}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    return app
