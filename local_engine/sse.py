"""OpenAI response bodies and SSE chunks for one request (chat and legacy completions).

Every chunk of one stream carries the same ``id``, ``created`` and ``model``. SSE framing is
OpenAI's: ``data: <json>\\n\\n`` per chunk, then ``data: [DONE]\\n\\n``. Chat streams start with
a chunk whose delta is ``{"role": "assistant", "content": ""}`` and end with an empty delta
carrying ``finish_reason``; with ``stream_options.include_usage`` every chunk has
``"usage": null`` and one last chunk has ``"choices": []`` and the usage (OpenAI's
CreateChatCompletionStreamResponse).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

__all__ = ["ChatChunks", "CompletionChunks", "sse", "usage_dict"]


class _UsageSource(Protocol):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def usage_dict(out: _UsageSource) -> dict[str, Any]:
    """OpenAI ``usage`` (tokens): ``{"prompt_tokens", "completion_tokens", "total_tokens",
    "prompt_tokens_details": {"cached_tokens"}}``; cached tokens are the prompt tokens whose
    KV came from the radix prefix cache."""
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
    }


def sse(obj: dict[str, Any]) -> bytes:
    """One SSE event: ``b"data: " + json + b"\\n\\n"``."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ChatChunks:
    """Builds ``chat.completion`` bodies and ``chat.completion.chunk`` events for one request."""

    def __init__(self, request_id: str, created: int, model: str, include_usage: bool = False):
        self.id = "chatcmpl-" + request_id
        self.created = created
        self.model = model
        self.include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def role_chunk(self) -> bytes:
        """First event: ``delta = {"role": "assistant", "content": ""}``."""
        return self._chunk({"role": "assistant", "content": ""}, None)

    def text_chunk(self, text: str) -> bytes:
        """A content delta."""
        return self._chunk({"content": text}, None)

    def tool_call_chunk(self, index: int, call: dict[str, Any]) -> bytes:
        """One whole tool call as a delta: ``{"tool_calls": [{"index", "id", "type",
        "function": {"name", "arguments"}}]}``."""
        return self._chunk({"tool_calls": [{"index": index, **call}]}, None)

    def finish_chunk(self, finish_reason: str | None) -> bytes:
        """Last choice event: empty delta + ``finish_reason``."""
        return self._chunk({}, finish_reason)

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """The ``include_usage`` event: ``choices: []`` + ``usage``."""
        return sse({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [], "usage": usage,
        })

    def full(
        self, message: dict[str, Any], finish_reason: str | None, usage: dict[str, Any]
    ) -> dict[str, Any]:
        """The non-stream ``chat.completion`` body."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": usage,
        }


class CompletionChunks:
    """Builds legacy ``text_completion`` bodies and stream events for one request."""

    def __init__(self, request_id: str, created: int, model: str, include_usage: bool = False):
        self.id = "cmpl-" + request_id
        self.created = created
        self.model = model
        self.include_usage = include_usage

    def _chunk(self, text: str, finish_reason: str | None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def text_chunk(self, text: str) -> bytes:
        """A text delta."""
        return self._chunk(text, None)

    def finish_chunk(self, finish_reason: str | None) -> bytes:
        """Last choice event: empty text + ``finish_reason``."""
        return self._chunk("", finish_reason)

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """The ``include_usage`` event: ``choices: []`` + ``usage``."""
        return sse({
            "id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model, "choices": [], "usage": usage,
        })

    def full(self, text: str, finish_reason: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        """The non-stream ``text_completion`` body."""
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": usage,
        }
