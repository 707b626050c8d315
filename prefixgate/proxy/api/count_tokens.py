"""``POST /v1/messages/count_tokens``: how many input tokens a Messages request would cost.

It runs the one pipeline (:mod:`prefixgate.proxy.pipeline.run`'s prepare and send: auth, rate
limits, tenant, body, route, deployments, breakers, retries, fallbacks), with the bridge chosen
by the routed backend's kind (:mod:`prefixgate.config.backend_kinds`):

- ``anthropic``: the identity bridge to ``base_url/messages/count_tokens`` (Anthropic counts).
- a kind that tokenizes (``local`` / ``openai_compat``): the
  :class:`~prefixgate.proxy.bridges.tokenize.CountTokens` bridge:
  the request is bridged to Chat Completions (the same A->O bridge ``/v1/messages`` uses) and
  sent to the engine's ``POST /tokenize`` (ours, vLLM and SGLang serve it beside ``/v1``): the
  exact count of the prompt the engine would prefill — its tokenizer and its chat template,
  tools included. Header ``x-prefixgate-token-count: exact``.
- otherwise, or when ``/tokenize`` answers 404: an estimate
(:func:`prefixgate.rewriter.analysis.tokens.json_tokens`
  over system, messages and tools, o200k / cl100k vocabularies), with ``"estimated": true`` in
  the body and ``x-prefixgate-token-count: estimated``.

Answer: ``{"input_tokens": int}`` (Anthropic's shape). Not a model call: no ledger row.
Errors are Anthropic-shaped: the backend's own error keeps its status, ``/tokenize``'s too (a
non-JSON body is wrapped; 429 / 5xx are retried first, as on every endpoint); a ``/tokenize``
that answers anything but ``{"count": int >= 0}``, or breaks off, is a 502.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.backend_kinds import traits
from prefixgate.proxy.bridges import Bridge
from prefixgate.proxy.bridges.tokenize import CountTokens
from prefixgate.proxy.core.errors import InvalidRequest, ProxyError
from prefixgate.proxy.http.body import check_model_stream
from prefixgate.proxy.pipeline.answer import answer, refuse
from prefixgate.proxy.pipeline.endpoint import Endpoint
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.prepare import prepare
from prefixgate.proxy.pipeline.send import send
from prefixgate.proxy.routing.router import Target
from prefixgate.rewriter.analysis.tokens import encoding_for_model, json_tokens, make_counter

HEADER = "x-prefixgate-token-count"


def estimate(body: dict[str, Any]) -> int:
    """Estimated input tokens of a Messages body: system + messages + tools as the model's
    vocabulary would count their JSON text (media at fixed costs), plus 4 per message for the
    role markers."""
    count = make_counter(encoding_for_model(str(body.get("model", ""))))
    parts = [body.get("system"), body.get("messages"), body.get("tools")]
    msgs = body.get("messages")
    roles = len(msgs) if isinstance(msgs, list) else 0
    return sum(json_tokens(p, count) for p in parts if p is not None) + 4 * roles


class NoCounter(ProxyError):
    """The target's backend cannot count tokens (not Anthropic, no ``/tokenize``): estimated."""

    status = 501


def _bridge(_ex: Exchange, target: Target) -> Bridge:
    kind = traits(target.backend.kind)
    if kind.wire == "anthropic":
        return Bridge("anthropic", "anthropic", COUNT_TOKENS.path, passes=False)
    if kind.tokenizes:
        return CountTokens()
    raise NoCounter(f"backend {target.backend_name!r} cannot count tokens")


def check(body: dict[str, Any]) -> None:
    """``model`` a string, ``messages`` an array (InvalidRequest, 400)."""
    check_model_stream(body)
    if not isinstance(body.get("messages"), list):
        raise InvalidRequest("Missing or invalid 'messages': expected an array.",
                             param="messages", code="invalid_type")


COUNT_TOKENS = Endpoint(api="anthropic", client="anthropic", path="/messages/count_tokens",
                        check=check, passes=False, salted=False, analyze=False, ledger=False,
                        streams=False)


def _estimated(body: dict[str, Any]) -> Response:
    return JSONResponse({"input_tokens": estimate(body), "estimated": True},
                        headers={HEADER: "estimated"})


async def count_tokens(state: ProxyState, request: Request) -> Response:
    """See module docstring."""
    ex = Exchange(COUNT_TOKENS, LedgerRow(endpoint=request.url.path))
    ex.bridge_of = _bridge
    try:
        await prepare(ex, request, state)
        resp = await send(ex, request, state)
    except NoCounter:
        ex.record(state, "estimated", 200)
        return _estimated(ex.body)
    except BaseException as e:
        return refuse(state, ex, e)
    exact = isinstance(ex.bridge, CountTokens)
    if exact and resp.status_code == 404:  # an engine without /tokenize
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        ex.record(state, "estimated", 200)
        return _estimated(ex.body)
    response = await answer(state, ex, resp)
    if exact and response.status_code == 200:
        response.headers[HEADER] = "exact"
    return response


def install(app: FastAPI, state: ProxyState) -> None:
    """Add ``POST /v1/messages/count_tokens``."""
    async def handler(request: Request) -> Response:
        return await count_tokens(state, request)

    app.add_api_route("/v1/messages/count_tokens", handler, methods=["POST"])


__all__ = ["COUNT_TOKENS", "HEADER", "count_tokens", "estimate", "install"]
