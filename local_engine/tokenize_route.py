"""``POST /tokenize``: a chat prompt's exact token count, as the engine would prefill it.

Body (vLLM's ``/tokenize`` shape): ``{"model"?, "messages": [...], "tools"?: [...]}`` (chat,
rendered through the tokenizer's chat template with the generation prompt, exactly as
``/v1/chat/completions`` renders it) or ``{"prompt": "text"}`` (raw text, no template). Answer:
``{"count": int, "max_model_len": int, "tokens": [int, ...]}``. Errors: OpenAI's shape, 400
(the same checks as a chat request: a non-text content part, a bad role).

The proxy's ``POST /v1/messages/count_tokens`` reads it for an exact count (vLLM and SGLang
serve the same route).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from local_engine.chat import encode_chat
from local_engine.protocol import ApiError, ChatMessage, parse_request


class TokenizeRequest(BaseModel):
    """``messages`` (+ ``tools``) or ``prompt``; unknown fields ignored."""

    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None


def install(app: FastAPI, engine: Any) -> None:
    """Add ``POST /tokenize`` for ``engine`` (its tokenizer and ``max_context_len``)."""

    async def tokenize(request: Request) -> JSONResponse:
        try:
            payload = await request.json()
        except ValueError:
            raise ApiError("The request body is not valid JSON.", code="invalid_json") from None
        req = parse_request(TokenizeRequest, payload)
        if req.messages is not None:
            messages = [m.model_dump(exclude_none=True) for m in req.messages]
            ids = encode_chat(engine.tokenizer, messages, req.tools or None)
        elif req.prompt is not None:
            ids = list(engine.tokenizer.encode(req.prompt))
        else:
            raise ApiError("Give 'messages' or 'prompt'.", param="messages",
                           code="missing_required_parameter")
        return JSONResponse({"count": len(ids), "max_model_len": engine.max_context_len,
                             "tokens": ids})

    app.add_api_route("/tokenize", tokenize, methods=["POST"])
