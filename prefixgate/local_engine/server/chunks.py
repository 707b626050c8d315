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

from prefixgate.local_engine.server.tool_calls import ToolCallStream, parse_tool_calls

__all__ = [
    "DONE",
    "ChatChunks",
    "ChatStreamWriter",
    "CompletionChunks",
    "CompletionStreamWriter",
    "chat_message",
    "sse",
    "usage_dict",
]

DONE = b"data: [DONE]\n\n"


class _UsageSource(Protocol):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def usage_dict(out: _UsageSource, transfer_tokens: int = 0) -> dict[str, Any]:
    """OpenAI ``usage`` (tokens): ``{"prompt_tokens", "completion_tokens", "total_tokens",
    "prompt_tokens_details": {"cached_tokens", "span_reused_tokens"}}``; cached tokens are the
    prompt tokens whose KV came from this engine's radix prefix cache (not prefilled);
    span_reused_tokens (an extension, a part of cached_tokens) those taken across a changed span
    (span reuse).

    ``transfer_tokens``: prompt tokens whose KV a P/D transfer brought for this request (they
    hit the tree because the prefill instance computed them, not because anything was cached:
    issue 34, item 13). They are taken out of ``cached_tokens`` and reported apart as
    ``prompt_tokens_details.kv_transfer_tokens`` (vLLM's ``external_kv_transfer`` source).

    With speculative decoding, ``completion_tokens_details`` carries OpenAI's predicted-output
    fields (``accepted_prediction_tokens`` / ``rejected_prediction_tokens``: draft tokens accepted
    / rejected) and the extension ``speculative`` ``{"num_drafts", "num_draft_tokens",
    "num_accepted_tokens", "mean_accepted_length"}`` (vLLM's names, this request only)."""
    usage: dict[str, Any] = {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": out.cached_tokens,
            "span_reused_tokens": int(getattr(out, "span_reused_tokens", 0) or 0)},
    }
    moved = max(0, min(transfer_tokens, out.cached_tokens))
    if moved:
        usage["prompt_tokens_details"]["cached_tokens"] = out.cached_tokens - moved
        usage["prompt_tokens_details"]["kv_transfer_tokens"] = moved
    drafts = int(getattr(out, "spec_drafts", 0) or 0)
    if drafts:
        proposed, accepted = int(out.spec_draft_tokens), int(out.spec_accepted_tokens)  # type: ignore[attr-defined]
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": proposed - accepted,
        }
        usage["speculative"] = {
            "num_drafts": drafts, "num_draft_tokens": proposed, "num_accepted_tokens": accepted,
            "mean_accepted_length": round(1 + accepted / drafts, 4),
        }
    return usage


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


class ChatStreamWriter:
    """Turns a chat request's text deltas into its SSE events (pure; no engine, no I/O).

    ``start()`` -> the role chunk; ``feed(delta)`` -> content / tool-call chunks (with
    ``parse_tools``, text is held back only while it may be a ``<tool_call>`` block, see
    ``tool_calls.ToolCallStream``); ``close(finish_reason, usage)`` -> flushed text, the
    finish chunk (``tool_calls`` when a call was emitted), the usage chunk when
    ``include_usage``, and ``data: [DONE]``.
    """

    def __init__(self, chunks: ChatChunks, parse_tools: bool) -> None:
        self.chunks = chunks
        self.tools = ToolCallStream() if parse_tools else None

    def start(self) -> list[bytes]:
        """The first event (role)."""
        return [self.chunks.role_chunk()]

    def _render(self, events: list[tuple[str, Any]]) -> list[bytes]:
        out = []
        for kind, value in events:
            if kind == "text":
                out.append(self.chunks.text_chunk(value))
            else:
                index, call = value
                out.append(self.chunks.tool_call_chunk(index, call))
        return out

    def feed(self, delta: str) -> list[bytes]:
        """Events for one text delta (possibly none)."""
        if self.tools is None:
            return [self.chunks.text_chunk(delta)] if delta else []
        return self._render(self.tools.feed(delta))

    def close(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[bytes]:
        """The closing events (see class docstring)."""
        out = self._render(self.tools.finish()) if self.tools is not None else []
        if self.tools is not None and self.tools.num_calls:
            finish_reason = "tool_calls"
        out.append(self.chunks.finish_chunk(finish_reason))
        if self.chunks.include_usage and usage is not None:
            out.append(self.chunks.usage_chunk(usage))
        out.append(DONE)
        return out


class CompletionStreamWriter:
    """SSE events of a legacy completion stream: same interface as ``ChatStreamWriter``."""

    def __init__(self, chunks: CompletionChunks) -> None:
        self.chunks = chunks

    def start(self) -> list[bytes]:
        """Legacy completions have no role chunk."""
        return []

    def feed(self, delta: str) -> list[bytes]:
        """A text chunk per non-empty delta."""
        return [self.chunks.text_chunk(delta)] if delta else []

    def close(self, finish_reason: str | None, usage: dict[str, Any] | None) -> list[bytes]:
        """Finish chunk, usage chunk when ``include_usage``, ``data: [DONE]``."""
        out = [self.chunks.finish_chunk(finish_reason)]
        if self.chunks.include_usage and usage is not None:
            out.append(self.chunks.usage_chunk(usage))
        out.append(DONE)
        return out


def chat_message(text: str, finish_reason: str | None, parse_tools: bool
                 ) -> tuple[dict[str, Any], str | None]:
    """The non-stream assistant ``message`` and finish reason for generated ``text``: with
    ``parse_tools`` and at least one well-formed ``<tool_call>``, ``content`` is the text around
    the calls (or null), ``tool_calls`` the calls, and the finish reason ``tool_calls``.
    ``refusal`` (null: this engine never refuses) and ``annotations`` (``[]``) are fields the
    current OpenAI schema requires of every answer message."""
    if parse_tools:
        parsed = parse_tool_calls(text)
        if parsed.tool_calls:
            return ({"role": "assistant", "content": parsed.content, "refusal": None,
                     "annotations": [], "tool_calls": parsed.tool_calls}, "tool_calls")
    return {"role": "assistant", "content": text, "refusal": None, "annotations": []}, finish_reason
