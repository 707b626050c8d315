"""The A->O bridge: an Anthropic Messages client served by an OpenAI-compatible backend.

Request (:func:`request_to_openai`)::

    system (string | text blocks)        -> first message {"role": "system", "content": str}
    user text / image blocks             -> user content parts (text, image_url data: URL)
    user tool_result blocks              -> {"role": "tool", "tool_call_id", "content"}, placed
                                            before the rest of that user turn (B18)
    assistant text + tool_use blocks     -> {"role": "assistant", "content": str | None,
                                            "tool_calls": [{"id", "type": "function",
                                            "function": {"name", "arguments": json str}}]}
    tools [{name, description, input_schema}] -> [{"type": "function", "function": {...}}]
    tool_choice auto|any|tool|none       -> "auto" | "required" | {"type": "function", ...} | "none"
    max_tokens, stop_sequences, temperature, top_p, top_k, stream, metadata.user_id
                                         -> max_tokens, stop, ..., stream (+ include_usage), user

An assistant turn that only calls tools gets ``content: null`` (OpenAI's rule), never an empty
text block. ``cache_control`` markers and thinking blocks have no OpenAI equivalent and are
dropped (prefix caching on these backends is automatic).

Answer (:func:`response_to_anthropic`, :class:`StreamMapper`): usage is mapped as B08 states —
``input_tokens = prompt_tokens - cached_tokens``, ``cache_read_input_tokens = cached_tokens``,
``cache_creation_input_tokens = 0`` (OpenAI-compatible caches have no separate write),
``output_tokens = completion_tokens`` — in the non-streamed body and in ``message_delta``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from proxy.sse import SSEEvent

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "function_call": "tool_use", "content_filter": "refusal"}

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _image_part(block: dict[str, Any]) -> dict[str, Any] | None:
    src = block.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
    elif src.get("type") == "url":
        url = src.get("url", "")
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _user_messages(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_msgs: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for b in content if isinstance(content, list) else []:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_result":
            text = _text(b.get("content"))
            if b.get("is_error"):
                text = f"Error: {text}"
            tool_msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""),
                              "content": text})
        elif kind == "text" and b.get("text"):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            img = _image_part(b)
            if img:
                parts.append(img)
    out = tool_msgs
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        out = out + [{"role": "user", "content": "".join(p["text"] for p in parts)
                      if only_text else parts}]
    return out


def _assistant_message(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    text, calls = "", []
    for b in content if isinstance(content, list) else []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text":
            text += b.get("text", "")
        elif b.get("type") == "tool_use":
            calls.append({"id": b.get("id", ""), "type": "function",
                          "function": {"name": b.get("name", ""),
                                       "arguments": json.dumps(b.get("input", {}),
                                                               ensure_ascii=False)}})
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


def _tool_choice(tc: Any) -> Any:
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": tc.get("name", "")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind or "", "auto")


def request_to_openai(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic Messages request -> Chat Completions request (see module docstring)."""
    out: dict[str, Any] = {"model": body["model"]}
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for m in body.get("messages", []):
        if m.get("role") == "assistant":
            messages.append(_assistant_message(m.get("content")))
        else:
            messages.extend(_user_messages(m.get("content")))
    out["messages"] = messages
    if body.get("tools"):
        out["tools"] = [{"type": "function", "function": {
            "name": t.get("name", ""), "description": t.get("description", ""),
            "parameters": t.get("input_schema", {"type": "object", "properties": {}})}}
            for t in body["tools"] if isinstance(t, dict)]
    if "tool_choice" in body:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    out["max_tokens"] = body["max_tokens"]
    for a, o in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                 ("stop_sequences", "stop")):
        if body.get(a) is not None:
            out[o] = body[a]
    user = (body.get("metadata") or {}).get("user_id")
    if user:
        out["user"] = user
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def usage_to_anthropic(u: Any) -> dict[str, int]:
    """OpenAI usage -> Anthropic usage (B08 mapping, see module docstring)."""
    u = u if isinstance(u, dict) else {}
    prompt = int(u.get("prompt_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {"input_tokens": max(0, prompt - cached), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": int(u.get("completion_tokens") or 0)}


def response_to_anthropic(resp: dict[str, Any], model: str) -> dict[str, Any]:
    """Non-streamed Chat Completion -> Anthropic ``message`` object."""
    choice = (resp.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = {"_raw": fn.get("arguments")}
        content.append({"type": "tool_use", "id": c.get("id", ""), "name": fn.get("name", ""),
                        "input": args})
    return {"id": "msg_" + str(resp.get("id", "")), "type": "message", "role": "assistant",
            "model": model, "content": content,
            "stop_reason": _STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None, "usage": usage_to_anthropic(resp.get("usage"))}


def error_to_anthropic(raw: bytes, status: int) -> dict[str, Any]:
    """An OpenAI-shaped upstream error body -> Anthropic's error shape."""
    try:
        msg = orjson.loads(raw).get("error", {}).get("message") or raw.decode(errors="replace")
    except (orjson.JSONDecodeError, AttributeError):
        msg = raw.decode(errors="replace")
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"),
                                       "message": str(msg)[:2000]}}


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class StreamMapper:
    """Chat Completions chunks -> Anthropic stream events, one upstream event at a time.

    ``map(raw, ev)`` returns the Anthropic events to write (possibly none): ``message_start``
    on the first chunk, ``content_block_start/delta/stop`` for text and each tool call
    (``input_json_delta``), and on ``[DONE]`` ``message_delta`` (stop_reason + usage) and
    ``message_stop``. An OpenAI-style in-stream error (``data: {"error": {...}}``) becomes
    Anthropic's ``event: error``.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.block: int = -1                 # index of the open content block, -1 = none
        self.block_kind = ""                 # "text" | "tool"
        self.tool_blocks: dict[int, int] = {}  # OpenAI tool_call index -> block index
        self.stop_reason = "end_turn"
        self.usage: dict[str, int] = usage_to_anthropic({})
        self.finished = False

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
        msg: dict[str, Any] = {"id": "msg_" + chunk_id, "type": "message", "role": "assistant",
                               "model": self.model, "content": [], "stop_reason": None,
                               "stop_sequence": None,
                               "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [_sse("message_start", {"type": "message_start", "message": msg})]

    def _finish(self) -> list[bytes]:
        if self.finished:
            return []
        self.finished = True
        out = [] if self.started else self._start("")
        out += self._close()
        out.append(_sse("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": self.stop_reason,
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
        if chunk.get("usage"):
            self.usage = usage_to_anthropic(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.block_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(_sse("content_block_delta", {
                    "type": "content_block_delta", "index": self.block,
                    "delta": {"type": "text_delta", "text": delta["content"]}}))
            for tc in delta.get("tool_calls") or []:
                i = tc.get("index", 0)
                fn = tc.get("function") or {}
                if i not in self.tool_blocks:
                    out += self._open("tool", {"type": "tool_use", "id": tc.get("id", ""),
                                               "name": fn.get("name", ""), "input": {}})
                    self.tool_blocks[i] = self.block
                if fn.get("arguments"):
                    out.append(_sse("content_block_delta", {
                        "type": "content_block_delta", "index": self.tool_blocks[i],
                        "delta": {"type": "input_json_delta",
                                  "partial_json": fn["arguments"]}}))
            if choice.get("finish_reason"):
                self.stop_reason = _STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return out
