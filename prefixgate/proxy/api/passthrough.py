"""Plain pass-through endpoints: ``POST /v1/embeddings`` and ``POST /v1/completions`` (legacy,
stream too).

Each runs the one pipeline (:mod:`prefixgate.proxy.pipeline.run`) like chat: routed by the
policy's model globs, sent through the deployments, breakers, retries and fallbacks to the
backend's ``base_url/embeddings`` / ``/completions`` with its own key, answered as the backend
answered (status, body, rate-limit headers), one ledger row per request with its usage and cost
(prompt / output tokens from the answer's ``usage``; a stream's from its usage chunk, or its
deltas). No rewrite pass applies: neither body has a prefix structure to stabilise. Neither
endpoint is bridged: a route whose primary backend speaks the Anthropic API is a 501 (Anthropic
has neither endpoint), and such fallbacks are left out. ``/v1/completions`` without
``max_tokens`` gets the route's default cap (:mod:`prefixgate.proxy.pipeline.output_cap`) and a
tenant's ``cache_salt`` (:mod:`prefixgate.proxy.http.tenants`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.proxy.http.body import check_model_stream
from prefixgate.proxy.pipeline.endpoint import Endpoint
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.run import run

EMBEDDINGS = Endpoint(api="openai", client="openai", path="/embeddings", check=check_model_stream,
                      passes=False, bridged=False, salted=False, analyze=False, streams=False)
COMPLETIONS = Endpoint(api="openai", client="openai", path="/completions",
                       check=check_model_stream, passes=False, bridged=False, cap="completions",
                       analyze=False)


def install(app: FastAPI, state: ProxyState) -> None:
    """Add the pass-through routes to ``app``."""
    async def embeddings(request: Request) -> Response:
        return await run(state, request, Exchange(EMBEDDINGS, LedgerRow(endpoint=request.url.path)))

    async def completions(request: Request) -> Response:
        return await run(state, request, Exchange(COMPLETIONS, LedgerRow(endpoint=request.url.path)))

    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
