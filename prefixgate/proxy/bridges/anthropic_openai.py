"""The A->O bridge: an Anthropic Messages client served by an OpenAI-compatible backend.

Request (:func:`request_to_openai`, in :mod:`prefixgate.proxy.bridges.anthropic_openai_request`): every field
mapped, carried between explicit delimiters, or refused with a 400 naming it; the full table is
``docs/bridges.md``.

:class:`AnthropicToOpenAI` is the bridge object (:mod:`prefixgate.proxy.bridges.base`).

Answer (:func:`response_to_anthropic`, :class:`StreamMapper`): usage is mapped as B08 states —
``input_tokens = prompt_tokens - cached_tokens``, ``cache_read_input_tokens = cached_tokens``,
``cache_creation_input_tokens = 0`` (OpenAI-compatible caches have no separate write),
``output_tokens = completion_tokens`` — in the non-streamed body and in ``message_delta``.
The counts are the engine's own where its ``usage`` lacks them (llama.cpp ``timings.cache_n``,
SGLang ``sglext``: :func:`prefixgate.proxy.core.usage.filled_usage`), so the client sees the
cache hits the ledger records.
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixgate.proxy.bridges.anthropic_openai_request import request_to_openai
from prefixgate.proxy.bridges.base import Translating
from prefixgate.proxy.bridges.validity import checked, openai_problem
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.nesting import first_too_deep
from prefixgate.proxy.core.sse import EventMapper, SSEEvent
from prefixgate.proxy.core.usage import (
    OpenAIStreamWatcher,
    StreamWatcher,
    Usage,
    engine_usage,
    filled_usage,
    usage_from_answer,
)

__all__ = ["RESPONSE", "AnthropicToOpenAI", "STREAM", "StreamMapper", "error_to_anthropic", "message_shell",
           "message_usage", "request_to_openai", "response_to_anthropic", "text_block",
           "tool_use_block", "usage_to_anthropic"]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "function_call": "tool_use", "content_filter": "refusal"}

# What the A->O bridge does with each field of the backend's answer (docs/bridges.md).
RESPONSE = {
    "id": "mapped: id (msg_ + id)",
    "model": "mapped: model (the name the client asked for)",
    "choices[0].message.content": "mapped: a text block",
    "choices[0].message.refusal": "mapped: a text block, stop_reason refusal",
    "choices[0].message.tool_calls[]": "mapped: tool_use blocks (arguments -> input, numbers "
                                       "exact; not a JSON object: {\"_raw\": text})",
    "choices[0].finish_reason": "mapped: stop_reason (stop -> end_turn, length -> max_tokens, "
                                "tool_calls -> tool_use, content_filter -> refusal)",
    "usage": "mapped: usage (B08: input = prompt - cached, cache_read = cached)",
    "timings (llama.cpp), sglext (SGLang)": "read: the engine's cached tokens fill usage where it "
                                            "has none; prefill / decode ms go to the ledger; "
                                            "not carried otherwise: no Messages counterpart",
    "choices[1..], logprobs": "never requested (n and logprobs are not sent)",
    "choices[0].message.reasoning_content": "not carried: reasoning was not requested "
                                            "(thinking is refused on the request side)",
    "object, created, system_fingerprint, service_tier": "not carried: no Messages counterpart",
}
STREAM = {
    "first chunk": "mapped: message_start",
    "delta.content": "mapped: text_delta in a text block",
    "delta.refusal": "mapped: text_delta; stop_reason refusal",
    "delta.tool_calls[]": "mapped: content_block_start tool_use + input_json_delta",
    "finish_reason": "mapped: message_delta.stop_reason",
    "usage chunk": "mapped: message_delta.usage",
    "timings (llama.cpp), sglext (SGLang)": "read: cached tokens into message_delta.usage where the "
                                            "usage chunk has none; times to the ledger",
    "[DONE]": "mapped: message_delta + message_stop",
    "{\"error\": ...}": "mapped: event: error",
    "delta.role": "mapped: implied by message_start",
    "delta.reasoning_content": "not carried: reasoning was not requested",
}

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


def usage_to_anthropic(u: Any) -> dict[str, Any]:
    """OpenAI usage -> Anthropic ``message_delta`` usage (B08 mapping, see module docstring),
    with every field the Messages schema requires of ``MessageDeltaUsage`` (the sub-objects a
    non-Anthropic backend cannot report are null)."""
    u = u if isinstance(u, dict) else {}
    prompt = int(u.get("prompt_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {"input_tokens": max(0, prompt - cached), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": int(u.get("completion_tokens") or 0),
            "output_tokens_details": None, "server_tool_use": None}


def message_usage(delta_usage: dict[str, Any]) -> dict[str, Any]:
    """A ``message_delta`` usage (:func:`usage_to_anthropic`) as the ``usage`` of a ``message``
    object: the Messages schema (``Usage``) also requires ``cache_creation`` (the write split by
    TTL: an OpenAI-compatible cache writes nothing it reports), ``inference_geo`` and
    ``service_tier`` (null: not reported)."""
    return {**delta_usage,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "inference_geo": None, "service_tier": None}


def message_shell(msg_id: str, model: str) -> dict[str, Any]:
    """A ``message`` object with every field the Messages schema requires, content empty and
    the stop fields null (``message_start``'s message; the answer fills it)."""
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "stop_details": None,
            "usage": message_usage(usage_to_anthropic({})), "container": None}


def text_block(text: str) -> dict[str, Any]:
    """A response ``text`` block (``citations`` is required: null, no citations asked)."""
    return {"type": "text", "text": text, "citations": None}


def tool_use_block(call_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """A response ``tool_use`` block; ``caller`` says the model called it itself (the schema's
    default, ``{"type": "direct"}``)."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input,
            "caller": {"type": "direct"}}


# Deepest parsed ``arguments`` an answer carries as an object: the answer's own four levels
# (message, content, block, input) on top stay under orjson's 255-level write limit.
ANSWER_ARGS_MAX_DEPTH = 200


def _tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` text -> ``input``: the JSON object (numbers exact), or, when
    the model wrote something else, ``{"_raw": text}`` so nothing of it is lost. An object
    nested deeper than :data:`ANSWER_ARGS_MAX_DEPTH` (which the translated answer could not be
    written with) is carried whole as ``{"_raw": text}`` too."""
    text = arguments if isinstance(arguments, str) else ""
    try:
        args = exactjson.loads(text or "{}")
    except ValueError:
        return {"_raw": arguments}
    if not isinstance(args, dict) or first_too_deep(args, ANSWER_ARGS_MAX_DEPTH) is not None:
        return {"_raw": arguments}
    return args


def response_to_anthropic(resp: dict[str, Any], model: str) -> dict[str, Any]:
    """Non-streamed Chat Completion -> Anthropic ``message`` object.

    ``choices[0].message``: ``content`` -> a text block, ``refusal`` -> a text block and
    ``stop_reason: "refusal"``, ``tool_calls`` -> tool_use blocks (:func:`_tool_input`);
    ``finish_reason`` -> ``stop_reason``; ``usage`` as B08. The table is ``docs/bridges.md``."""
    choice = (resp.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append(text_block(msg["content"]))
    if msg.get("refusal"):
        content.append(text_block(msg["refusal"]))
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") or {}
        content.append(tool_use_block(c.get("id", ""), fn.get("name", ""),
                                      _tool_input(fn.get("arguments"))))
    stop = _STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn")
    out = message_shell("msg_" + str(resp.get("id", "")), model)
    out.update(content=content, stop_reason="refusal" if msg.get("refusal") else stop,
               usage=message_usage(usage_to_anthropic(filled_usage(resp.get("usage"), engine_usage(resp)))))
    return out


def error_to_anthropic(raw: bytes, status: int) -> dict[str, Any]:
    """An OpenAI-shaped upstream error body -> Anthropic's error shape."""
    try:
        msg = orjson.loads(raw).get("error", {}).get("message") or raw.decode(errors="replace")
    except (orjson.JSONDecodeError, AttributeError):
        msg = raw.decode(errors="replace")
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"),
                                       "message": str(msg)[:2000]}}


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + exactjson.dumps(data) + b"\n\n"


class StreamMapper:
    """Chat Completions chunks -> Anthropic stream events, one upstream event at a time.

    ``map(raw, ev)`` returns the Anthropic events to write (possibly none): ``message_start``
    on the first chunk, ``content_block_start/delta/stop`` for text (``content`` and
    ``refusal`` deltas) and each tool call (``input_json_delta``), and on ``[DONE]``
    ``message_delta`` (stop_reason + usage) and ``message_stop``. An OpenAI-style in-stream
    error (``data: {"error": {...}}``) becomes Anthropic's ``event: error``.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.block: int = -1                 # index of the open content block, -1 = none
        self.block_kind = ""                 # "text" | "tool"
        self.tool_blocks: dict[int, int] = {}  # OpenAI tool_call index -> block index
        self.stop_reason = "end_turn"
        self.usage: dict[str, Any] = usage_to_anthropic({})
        self.last_usage: Any = None          # the last usage chunk's object
        self.engine = Usage()                # the engine's own fields, newest non-null
        self.finished = False
        self.refused = False                 # a refusal delta was seen: stop_reason "refusal"

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.block += 1
        self.block_kind = kind
        out.append(_sse("content_block_start", {"type": "content_block_start",
                                                "index": self.block, "content_block": block}))
        return out

    def _close(self) -> list[bytes]:
        if not self.block_kind:
            return []
        self.block_kind = ""
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": self.block})]

    def _start(self, chunk_id: str) -> list[bytes]:
        self.started = True
        msg = message_shell("msg_" + chunk_id, self.model)
        return [_sse("message_start", {"type": "message_start", "message": msg})]

    def _finish(self) -> list[bytes]:
        if self.finished:
            return []
        self.finished = True
        out = [] if self.started else self._start("")
        out += self._close()
        out.append(_sse("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": "refusal" if self.refused
                                                    else self.stop_reason,
                                                    "stop_sequence": None},
                                          "usage": self.usage}))
        out.append(_sse("message_stop", {"type": "message_stop"}))
        return out

    def map(self, raw: bytes, ev: SSEEvent) -> list[bytes]:
        """See class docstring."""
        if ev.data is None:
            return []
        if ev.data.strip() == "[DONE]":
            return self._finish()
        try:
            chunk = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(chunk, dict):
            return []
        if "error" in chunk and not chunk.get("choices"):  # vLLM / SGLang mid-stream failure
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else err
            return [_sse("error", {"type": "error", "error": {
                "type": "api_error", "message": str(message or "upstream error")[:2000]}})]
        out = [] if self.started else self._start(str(chunk.get("id", "")))
        if chunk.get("usage") or chunk.get("timings") or chunk.get("sglext"):
            self.last_usage = chunk.get("usage") or self.last_usage
            self.engine.merge(engine_usage(chunk))
            self.usage = usage_to_anthropic(filled_usage(self.last_usage, self.engine))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("refusal"):
                self.refused = True
            for text in (delta.get("content"), delta.get("refusal")):
                if not text:
                    continue
                if self.block_kind != "text":
                    out += self._open("text", text_block(""))
                out.append(_sse("content_block_delta", {
                    "type": "content_block_delta", "index": self.block,
                    "delta": {"type": "text_delta", "text": text}}))
            for tc in delta.get("tool_calls") or []:
                i = tc.get("index", 0)
                fn = tc.get("function") or {}
                if i not in self.tool_blocks:
                    out += self._open("tool", tool_use_block(tc.get("id", ""),
                                                             fn.get("name", ""), {}))
                    self.tool_blocks[i] = self.block
                if fn.get("arguments"):
                    out.append(_sse("content_block_delta", {
                        "type": "content_block_delta", "index": self.tool_blocks[i],
                        "delta": {"type": "input_json_delta",
                                  "partial_json": fn["arguments"]}}))
            if choice.get("finish_reason"):
                self.stop_reason = _STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return out


class AnthropicToOpenAI(Translating):
    """Anthropic Messages client -> OpenAI-compatible backend (``/chat/completions``)."""

    def __init__(self, path: str = "/chat/completions") -> None:
        super().__init__("anthropic", "openai", path)

    def request(self, body: dict[str, Any], max_depth: int) -> dict[str, Any]:
        """The Chat Completions body: every field mapped, carried as delimited text, or refused
        (400 naming it; ``docs/bridges.md``), then checked as a whole."""
        return checked(request_to_openai, body, openai_problem)

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher, EventMapper | None]:
        return OpenAIStreamWatcher(), StreamMapper(model).map

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        usage = usage_from_answer(answer, self.wire)
        return exactjson.dumps(response_to_anthropic(answer, model)), usage

    def error(self, raw: bytes, status: int) -> bytes | None:
        return orjson.dumps(error_to_anthropic(raw, status))
