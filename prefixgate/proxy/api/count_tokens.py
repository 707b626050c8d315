"""``POST /v1/messages/count_tokens``: how many input tokens a Messages request would cost.

By the routed backend's kind:

- ``anthropic``: passed through to ``base_url/messages/count_tokens`` (Anthropic counts).
- ``local`` / ``openai_compat``: the request is bridged to Chat Completions (the same A->O
  bridge ``/v1/messages`` uses) and sent to the engine's ``POST /tokenize`` (ours, vLLM and
  SGLang serve it beside ``/v1``): the exact count of the prompt the engine would prefill —
  its tokenizer and its chat template, tools included. Header ``x-prefixgate-token-count:
  exact``.
- otherwise, or when ``/tokenize`` is not there: an estimate (:func:`prefixgate.rewriter.tokens.json_tokens`
  over system, messages and tools, o200k / cl100k vocabularies), with ``"estimated": true`` in
  the body and ``x-prefixgate-token-count: estimated``.

Answer: ``{"input_tokens": int}`` (Anthropic's shape). Not a model call: no ledger row.
Errors are Anthropic-shaped: the backend's own error keeps its status (a non-JSON body is
wrapped); a ``/tokenize`` that fails or answers anything but ``{"count": int >= 0}`` is a 502.
Backend answers are read up to 1 MiB.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger import LedgerRow
from prefixgate.proxy.api.passthrough import ERROR_BODY_MAX_BYTES, SideCall
from prefixgate.proxy.bridges import translate
from prefixgate.proxy.core.errors import InvalidRequest, UpstreamUnavailable, error_response
from prefixgate.proxy.http.headers import downstream_headers
from prefixgate.proxy.upstream.client import read_at_most
from prefixgate.rewriter.tokens import encoding_for_model, json_tokens, make_counter

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


def _engine_root(base_url: str) -> str:
    return base_url[:-3] if base_url.endswith("/v1") else base_url


async def _exact(call: SideCall) -> int | None:
    """The engine's own count through ``/tokenize``, or None when it has no such route."""
    assert call.target is not None
    chat = translate.request("anthropic", {**call.body, "max_tokens": 1},
                             call.state.policy.limits.max_json_depth)
    ask = {"model": chat["model"], "messages": chat["messages"]}
    if chat.get("tools"):
        ask["tools"] = chat["tools"]
    resp = await call.send(_engine_root(call.target.backend.base_url) + "/tokenize",
                           orjson.dumps(ask))
    try:
        if resp.status_code == 404:
            return None
        content = await read_at_most(resp, ERROR_BODY_MAX_BYTES)
        if resp.status_code >= 400:
            raise UpstreamUnavailable(f"the backend's /tokenize answered {resp.status_code}: "
                                      f"{content[:200].decode(errors='replace')}")
        try:
            answer = orjson.loads(content)
        except orjson.JSONDecodeError:
            answer = None
        count = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise UpstreamUnavailable("the backend's /tokenize sent an unreadable answer")
        return count
    finally:
        await resp.aclose()


def _is_object(content: bytes) -> bool:
    try:
        return isinstance(orjson.loads(content), dict)
    except orjson.JSONDecodeError:
        return False


async def count_tokens(state: Any, request: Request) -> Response:
    """See module docstring."""
    call = SideCall(state, request, "anthropic", LedgerRow(endpoint=request.url.path),
                    ledger=False)
    try:
        await call.read()
        assert call.target is not None
        if not isinstance(call.body.get("messages"), list):
            raise InvalidRequest("Missing or invalid 'messages': expected an array.",
                                 param="messages", code="invalid_type")
        kind = call.target.backend.kind
        if kind == "anthropic":
            resp = await call.send(call.target.backend.base_url + "/messages/count_tokens",
                                   call.raw)
            if resp.status_code >= 400:  # its error, in Anthropic's shape even when not JSON
                return await call.error(resp)
            try:
                content = await read_at_most(resp, ERROR_BODY_MAX_BYTES)
            finally:
                await resp.aclose()
            if not _is_object(content):
                raise UpstreamUnavailable("the backend's count_tokens sent an unreadable answer")
            return Response(content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type", "application/json"),
                            headers=downstream_headers(resp.headers))
        exact = await _exact(call) if kind in ("local", "openai_compat") else None
    except httpx.HTTPError:
        return error_response(UpstreamUnavailable("the backend could not be reached"),
                              "anthropic")
    except Exception as e:
        return call.refuse(e)
    if exact is not None:
        return JSONResponse({"input_tokens": exact}, headers={HEADER: "exact"})
    return JSONResponse({"input_tokens": estimate(call.body), "estimated": True},
                        headers={HEADER: "estimated"})


def install(app: FastAPI, state: Any) -> None:
    """Add ``POST /v1/messages/count_tokens``."""
    async def handler(request: Request) -> Response:
        return await count_tokens(state, request)

    app.add_api_route("/v1/messages/count_tokens", handler, methods=["POST"])


__all__ = ["HEADER", "count_tokens", "estimate", "install"]
