"""``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages`` (Anthropic).

The endpoints whose bodies the rewriter's passes know best; a client whose API differs from its
backend's goes through a bridge (:mod:`prefixgate.proxy.bridges`). Each request runs the one
pipeline (:mod:`prefixgate.proxy.pipeline.run`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.proxy.api.openapi_schemas import ANTHROPIC_MESSAGES_REQUEST, OPENAI_CHAT_REQUEST, request_body
from prefixgate.proxy.http.body import check_anthropic, check_openai
from prefixgate.proxy.pipeline.endpoint import Endpoint
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.run import run

CHAT = Endpoint(api="openai", client="openai", path="/chat/completions", check=check_openai,
                cap="openai")
MESSAGES = Endpoint(api="anthropic", client="anthropic", path="/messages", check=check_anthropic)


def install(app: FastAPI, state: ProxyState) -> None:
    """Add the two chat routes to ``app``."""
    @app.post("/v1/chat/completions", openapi_extra=request_body(OPENAI_CHAT_REQUEST))
    async def chat_completions(request: Request) -> Response:
        return await run(state, request, Exchange(CHAT, LedgerRow(endpoint=request.url.path)))

    @app.post("/v1/messages", openapi_extra=request_body(ANTHROPIC_MESSAGES_REQUEST))
    async def messages(request: Request) -> Response:
        return await run(state, request, Exchange(MESSAGES, LedgerRow(endpoint=request.url.path)))
