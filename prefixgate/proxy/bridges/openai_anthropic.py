"""The O->A bridge: an OpenAI Chat Completions client served by an Anthropic Messages backend.

Request (:func:`request_to_anthropic`, in :mod:`prefixgate.proxy.bridges.openai_anthropic_request`): every
field mapped, carried between explicit delimiters, or refused with a 400 naming it; the full table is
``docs/bridges.md``.

Answer (:func:`response_to_openai`, :class:`ChunkMapper`): usage as B07 states —
``prompt_tokens = input + cache_read + cache_creation``, ``prompt_tokens_details.cached_tokens =
cache_read_input_tokens``, merged across ``message_start`` and ``message_delta``; the final usage
chunk is sent only when the client asked for ``stream_options.include_usage``.
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixgate.proxy.bridges.base import Translating
from prefixgate.proxy.bridges.openai_anthropic_request import DEFAULT_MAX_TOKENS, request_to_anthropic
from prefixgate.proxy.bridges.validity import anthropic_problem, checked
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.sse import EventMapper, SSEEvent
from prefixgate.proxy.core.usage import (
    AnthropicStreamWatcher,
    StreamWatcher,
    Usage,
    anthropic_usage,
    usage_from_answer,
)

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}

# What the O->A bridge does with each field of the backend's answer (docs/bridges.md).
RESPONSE = {
    "id": "mapped: id (chatcmpl- + id)",
    "model": "mapped: model (the name the client asked for)",
    "content[] text": "mapped: message.content, in order (joined as the stream's deltas are)",
    "content[] tool_use": "mapped: message.tool_calls (input -> arguments, numbers exact)",
    "stop_reason": "mapped: finish_reason (end_turn / stop_sequence / pause_turn -> stop, "
                   "max_tokens -> length, tool_use -> tool_calls, refusal -> content_filter)",
    "usage": "mapped: usage (B07: prompt = input + cache_read + cache_creation)",
    "stop_sequence": "not carried: Chat Completions does not say which stop matched",
    "content[] thinking / server tool blocks": "never requested (refused on the request side)",
    "type, role, container": "mapped: object chat.completion, role assistant; container never "
                             "requested",
}
STREAM = {
    "message_start": "mapped: first chunk (role assistant)",
    "content_block_start tool_use": "mapped: tool_calls delta with id and name",
    "content_block_delta text_delta": "mapped: content delta",
    "content_block_delta input_json_delta": "mapped: tool_calls arguments delta",
    "message_delta": "mapped: finish_reason chunk",
    "message_stop": "mapped: usage chunk (when include_usage) + [DONE]",
    "error": "mapped: {\"error\": ...}",
    "ping, content_block_stop": "nothing to carry",
    "thinking / signature / citations deltas": "never requested",
}

__all__ = ["DEFAULT_MAX_TOKENS", "RESPONSE", "STREAM", "ChunkMapper", "error_to_openai",
           "request_to_anthropic", "response_to_openai", "usage_to_openai"]


def usage_to_openai(u: Usage) -> dict[str, Any]:
    """Usage -> OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens`` (B07)."""
    prompt, out = u.prompt_tokens or 0, u.output_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens or 0}}


def response_to_openai(msg: dict[str, Any], model: str) -> dict[str, Any]:
    """Non-streamed Anthropic ``message`` -> ``chat.completion``."""
    text = "".join(b.get("text", "") for b in msg.get("content") or [] if b.get("type") == "text")
    calls = [{"id": b.get("id", ""), "type": "function",
              "function": {"name": b.get("name", ""),
                           "arguments": exactjson.dumps(b.get("input", {})).decode()}}
             for b in msg.get("content") or [] if b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None,
                               "annotations": []}
    if calls:
        message["tool_calls"] = calls
    return {"id": "chatcmpl-" + str(msg.get("id", "")), "object": "chat.completion",
            "created": 0, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": _FINISH.get(msg.get("stop_reason") or "", "stop")}],
            "usage": usage_to_openai(anthropic_usage(msg.get("usage")))}


def error_to_openai(raw: bytes, status: int) -> dict[str, Any]:
    """An Anthropic-shaped upstream error body -> OpenAI's error shape."""
    try:
        err = orjson.loads(raw).get("error", {})
        message, kind = err.get("message", ""), err.get("type", "api_error")
    except (orjson.JSONDecodeError, AttributeError):
        message, kind = raw.decode(errors="replace"), "api_error"
    return {"error": {"message": str(message)[:2000], "type": kind, "param": None,
                      "code": None}}


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + exactjson.dumps(obj) + b"\n\n"


class ChunkMapper:
    """Anthropic stream events -> Chat Completions chunks, one upstream event at a time.

    ``watcher`` is the relay's :class:`~prefixgate.proxy.core.usage.AnthropicStreamWatcher` (it has already
    seen each event when :meth:`map` runs), so the usage chunk carries the merged counts.
    """

    def __init__(self, model: str, watcher: AnthropicStreamWatcher, include_usage: bool) -> None:
        self.model = model
        self.watcher = watcher
        self.include_usage = include_usage
        self.id = "chatcmpl-"
        self.tool_index: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_call index

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": 0,
                               "model": self.model,
                               "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                            "finish_reason": finish}]}
        return _data(obj)

    def map(self, raw: bytes, ev: SSEEvent) -> list[bytes]:
        """See class docstring."""
        if ev.data is None:
            return []
        try:
            obj = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            return []
        kind = obj.get("type", ev.event) if isinstance(obj, dict) else None
        if kind == "message_start":
            self.id = "chatcmpl-" + str((obj.get("message") or {}).get("id", ""))
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") == "tool_use":
                i = self.tool_index[obj.get("index", 0)] = len(self.tool_index)
                return [self._chunk({"tool_calls": [{
                    "index": i, "id": block.get("id", ""), "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": ""}}]})]
            return []
        if kind == "content_block_delta":
            d = obj.get("delta") or {}
            if d.get("type") == "text_delta":
                return [self._chunk({"content": d.get("text", "")})]
            if d.get("type") == "input_json_delta":
                i = self.tool_index.get(obj.get("index", 0), 0)
                return [self._chunk({"tool_calls": [{
                    "index": i, "function": {"arguments": d.get("partial_json", "")}}]})]
            return []
        if kind == "message_delta":
            stop = (obj.get("delta") or {}).get("stop_reason")
            return [self._chunk({}, _FINISH.get(stop or "", "stop"))]
        if kind == "message_stop":
            out = []
            if self.include_usage:
                out.append(_data({"id": self.id, "object": "chat.completion.chunk",
                                  "created": 0, "model": self.model, "choices": [],
                                  "usage": usage_to_openai(self.watcher.usage)}))
            return out + [b"data: [DONE]\n\n"]
        if kind == "error":
            return [_data({"error": obj.get("error", {})})]
        return []


class OpenAIToAnthropic(Translating):
    """OpenAI Chat Completions client -> Anthropic backend (``/messages``)."""

    def __init__(self, path: str = "/messages") -> None:
        super().__init__("openai", "anthropic", path)

    def request(self, body: dict[str, Any], max_depth: int) -> dict[str, Any]:
        """The Messages body: every field mapped, carried as delimited text, or refused (400
        naming it; ``docs/bridges.md``), then checked as a whole; NestingTooDeep (400) for
        tool-call arguments nested deeper than ``max_depth``."""
        return checked(lambda b, origins: request_to_anthropic(b, max_depth, origins), body,
                       anthropic_problem)

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher, EventMapper | None]:
        watcher = AnthropicStreamWatcher()
        opts = body.get("stream_options")  # checked by request(): an object or absent
        include = isinstance(opts, dict) and opts.get("include_usage") is True
        return watcher, ChunkMapper(model, watcher, include).map

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        usage = usage_from_answer(answer, self.wire)
        return exactjson.dumps(response_to_openai(answer, model)), usage

    def error(self, raw: bytes, status: int) -> bytes | None:
        return orjson.dumps(error_to_openai(raw, status))
