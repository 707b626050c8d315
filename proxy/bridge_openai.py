"""The O->A bridge: an OpenAI Chat Completions client served by an Anthropic Messages backend.

Request (:func:`request_to_anthropic`)::

    system / developer messages     -> "system": a string, or text blocks when any part carries
                                       extra keys such as cache_control (never collapsed, B02)
    user text / image_url parts     -> user content (text blocks keep cache_control; data: URLs
                                       -> base64 image sources, http(s) -> url sources)
    assistant content + tool_calls  -> text block (only when non-empty) + tool_use blocks
                                       (arguments parsed to ``input``); an empty assistant turn
                                       is dropped, never sent as an empty text block (B18)
    tool messages                   -> tool_result blocks, first in the next user turn (B16)
    tools / tool_choice             -> {name, description, input_schema} / auto|any|none|tool
    max_completion_tokens|max_tokens-> max_tokens (default 4096: Anthropic requires it)
    stop, temperature, top_p, user  -> stop_sequences, temperature, top_p, metadata.user_id

Answer (:func:`response_to_openai`, :class:`ChunkMapper`): usage as B07 states —
``prompt_tokens = input + cache_read + cache_creation``, ``prompt_tokens_details.cached_tokens =
cache_read_input_tokens``, merged across ``message_start`` and ``message_delta``; the final usage
chunk is sent only when the client asked for ``stream_options.include_usage``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from proxy.sse import SSEEvent
from proxy.usage import AnthropicStreamWatcher, Usage, anthropic_usage

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}
DEFAULT_MAX_TOKENS = 4096


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": head or "image/png",
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any) -> list[dict[str, Any]]:
    """OpenAI content (string or parts) -> Anthropic blocks; empty text dropped."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for p in content if isinstance(content, list) else []:
        if not isinstance(p, dict):
            continue
        if p.get("type") in ("text", "input_text") and p.get("text"):
            block = {"type": "text", "text": p["text"]}
            if "cache_control" in p:
                block["cache_control"] = p["cache_control"]
            out.append(block)
        elif p.get("type") == "image_url":
            iu = p.get("image_url")
            url = iu.get("url", "") if isinstance(iu, dict) else str(iu or "")
            out.append(_image_block(url))
    return out


def _system(msgs: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    parts = [m.get("content") for m in msgs]
    if all(isinstance(p, str) for p in parts):
        text = "\n\n".join(p for p in parts if p)
        return text or None
    blocks = [b for p in parts for b in _blocks(p)]
    return blocks or None


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError:
        args = {"_raw": fn.get("arguments")}
    return {"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""),
            "input": args if isinstance(args, dict) else {"value": args}}


def _tool_choice(tc: Any) -> dict[str, Any]:
    if isinstance(tc, dict):
        return {"type": "tool", "name": (tc.get("function") or {}).get("name", "")}
    return {"type": {"required": "any", "none": "none"}.get(str(tc), "auto")}


def request_to_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    """Chat Completions request -> Messages request (see module docstring)."""
    system_msgs = [m for m in body["messages"] if m.get("role") in ("system", "developer")]
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for m in body["messages"]:
        role = m.get("role")
        if role == "assistant":
            add("assistant", _blocks(m.get("content"))
                + [_tool_use(c) for c in m.get("tool_calls") or []])
        elif role == "tool":
            text = m.get("content")
            text = text if isinstance(text, str) else "".join(
                b.get("text", "") for b in _blocks(text) if b["type"] == "text")
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""),
                          "content": text}])
        elif role == "user":
            add("user", _blocks(m.get("content")))
    out: dict[str, Any] = {"model": body["model"],
                           "max_tokens": body.get("max_completion_tokens")
                           or body.get("max_tokens") or DEFAULT_MAX_TOKENS}
    system = _system(system_msgs)
    if system is not None:
        out["system"] = system
    out["messages"] = turns
    if body.get("tools"):
        out["tools"] = [{"name": (t.get("function") or {}).get("name", ""),
                         "description": (t.get("function") or {}).get("description", ""),
                         "input_schema": (t.get("function") or {}).get(
                             "parameters", {"type": "object", "properties": {}})}
                        for t in body["tools"] if isinstance(t, dict)]
    if "tool_choice" in body:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    for k in ("temperature", "top_p"):
        if body.get(k) is not None:
            out[k] = body[k]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("user"):
        out["metadata"] = {"user_id": body["user"]}
    if body.get("stream"):
        out["stream"] = True
    return out


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
                           "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}}
             for b in msg.get("content") or [] if b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
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
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ChunkMapper:
    """Anthropic stream events -> Chat Completions chunks, one upstream event at a time.

    ``watcher`` is the relay's :class:`~proxy.usage.AnthropicStreamWatcher` (it has already seen
    each event when :meth:`map` runs), so the usage chunk carries the merged counts.
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
