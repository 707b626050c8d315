"""``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages`` (Anthropic): the model
endpoints whose bodies the rewriter's passes know best. Each request runs the pipeline
(:mod:`prefixgate.proxy.pipeline`): prepare -> send -> answer -> record.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from prefixgate.cache.ledger import LedgerRow
from prefixgate.proxy.api.openapi_schemas import ANTHROPIC_MESSAGES_REQUEST, OPENAI_CHAT_REQUEST, request_body
from prefixgate.proxy.core.errors import Api
from prefixgate.proxy.pipeline.answer import answer, refuse
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.prepare import prepare
from prefixgate.proxy.pipeline.send import send


async def serve(state: ProxyState, request: Request, api: Api) -> Response:
    """Serve one model request end to end (see module docstring).

    Everything that can be checked or translated happens before the send; from the send on, the
    upstream response is owned by :func:`prefixgate.proxy.pipeline.answer.answer`, which closes it on every
    path. Every request writes exactly one ledger row (:meth:`Exchange.record`).
    """
    ex = Exchange(api, LedgerRow(endpoint=request.url.path))
    try:
        await prepare(ex, request, state)                               # prepare
        resp = await send(ex, request, state)                           # send (with retries)
    except BaseException as e:
        return refuse(state, ex, e)
    return await answer(state, ex, resp)                                # answer, record


def install(app: FastAPI, state: ProxyState) -> None:
    """Add the two chat routes to ``app``."""
    @app.post("/v1/chat/completions", openapi_extra=request_body(OPENAI_CHAT_REQUEST))
    async def chat_completions(request: Request) -> Response:
        return await serve(state, request, "openai")

    @app.post("/v1/messages", openapi_extra=request_body(ANTHROPIC_MESSAGES_REQUEST))
    async def messages(request: Request) -> Response:
        return await serve(state, request, "anthropic")
