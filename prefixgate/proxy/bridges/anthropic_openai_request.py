"""A->O request: an Anthropic Messages body -> a Chat Completions body, lossless or refused.

Every key the Messages API allows is in one of the field tables below (``FIELDS`` gathers them
for ``docs/bridges.md``); each is mapped to its Chat Completions counterpart, carried as text
between explicit delimiters (``<document ...>`` ... ``</document>``), or refused with a 400
naming it (:mod:`prefixgate.proxy.bridges.fields`). A key no table names is refused too. Everything is read
and checked here, before anything is sent. Sources: Anthropic Messages API reference (create
message: body, content blocks, tools) and OpenAI Chat Completions reference (create).

Text blocks stay separate content parts (never glued); a turn that is one text block becomes a
plain string. ``cache_control`` is a caching hint with no wire counterpart: OpenAI-compatible
backends cache prefixes automatically, so the marker is satisfied, not sent.
"""

from __future__ import annotations

from typing import Any

from prefixgate.proxy.bridges.fields import (
    arr,
    boolean,
    close_tag,
    integer,
    known_keys,
    number,
    obj,
    open_tag,
    refuse,
    string,
)
from prefixgate.proxy.core import exactjson

Part = dict[str, Any]

TOP = {
    "model": "mapped: model",
    "messages": "mapped: messages (see the message tables)",
    "max_tokens": "mapped: max_tokens (the same integer, 0 included)",
    "system": "mapped: a first system message; one text part per block",
    "metadata": "mapped: metadata.user_id -> user; any other key: 400",
    "stop_sequences": "mapped: stop",
    "stream": "mapped: stream, plus stream_options.include_usage (usage for message_delta)",
    "temperature": "mapped: temperature",
    "top_p": "mapped: top_p",
    "top_k": "mapped: top_k (vLLM / SGLang / llama.cpp extension)",
    "tools": "mapped: function tools; server tools (web_search, bash, ...): 400",
    "tool_choice": "mapped: tool_choice, disable_parallel_tool_use -> parallel_tool_calls",
    "thinking": "type disabled: mapped (the default: no reasoning); enabled / adaptive: 400",
    "service_tier": "auto -> auto (the default on both, sent as given); standard_only -> default",
    "cache_control": "mapped: automatic prefix caching (the backend caches without a marker)",
    "diagnostics": "mapped: a cache-diagnostics request; no counterpart asked (the answer is "
                   "unchanged)",
    "prompt_cache_key": "mapped: prompt_cache_key (not a Messages field: what prefixgate adds "
                        "on an OpenAI route, one key per conversation; a routing hint)",
    "prompt_cache_retention": "mapped: prompt_cache_retention (as prompt_cache_key)",
    "container": "400: server-side container, no counterpart",
    "context_management": "400: server-side context editing, no counterpart",
    "mcp_servers": "400: server-side MCP connector, no counterpart",
    "output_config": "400: effort / format have no exact counterpart",
    "output_format": "400: not translated (no exact counterpart kept)",
    "inference_geo": "400: no counterpart",
}
MESSAGE = {"role": "mapped: role (user | assistant; system: a system message at the same position, "
                   "its text blocks as for the top-level system; anything else: 400)",
           "content": "mapped: content (string, or blocks: see the block tables)"}
TEXT = {"type": "mapped", "text": "mapped: a text part (its own part, never glued)",
        "cache_control": "mapped: automatic prefix caching",
        "citations": "null / []: mapped; a non-empty list: 400"}
IMAGE = {"type": "mapped", "source": "base64 -> image_url data: URL; url -> image_url; file: 400",
         "cache_control": "mapped: automatic prefix caching"}
DOCUMENT = {"type": "mapped",
            "source": "text / content: carried as text between <document> and </document>; "
                      "base64 PDF: mapped to a file part; url / file: 400",
            "title": "carried: the <document title=...> attribute (PDF: the file name)",
            "context": "carried: the <document context=...> attribute",
            "citations": "null / enabled false: mapped; enabled true: 400",
            "cache_control": "mapped: automatic prefix caching"}
SEARCH_RESULT = {"type": "mapped",
                 "source": "carried: <search_result source=...>",
                 "title": "carried: <search_result title=...>",
                 "content": "carried: its text blocks, each its own part, then </search_result>",
                 "citations": "null / enabled false: mapped; enabled true: 400",
                 "cache_control": "mapped: automatic prefix caching"}
TOOL_RESULT = {"type": "mapped", "tool_use_id": "mapped: a tool message's tool_call_id",
               "content": "mapped: its content (text parts; documents / search results "
                          "carried as above; images: 400, tool messages are text-only)",
               "is_error": "true: carried as <tool_error> ... </tool_error> around the content",
               "cache_control": "mapped: automatic prefix caching"}
TOOL_USE = {"type": "mapped", "id": "mapped: tool_calls[].id",
            "name": "mapped: tool_calls[].function.name",
            "input": "mapped: tool_calls[].function.arguments (JSON text, numbers exact)",
            "cache_control": "mapped: automatic prefix caching"}
TOOL = {"name": "mapped: function.name", "description": "mapped: function.description",
        "input_schema": "mapped: function.parameters", "strict": "mapped: function.strict",
        "type": "custom / absent: mapped; a server tool type: 400",
        "cache_control": "mapped: automatic prefix caching"}
TOOL_CHOICE = {"type": "auto -> auto, any -> required, tool -> {function}, none -> none",
               "name": "mapped: tool_choice.function.name",
               "disable_parallel_tool_use": "mapped: parallel_tool_calls = not it"}
METADATA = {"user_id": "mapped: user"}
BLOCKS_REFUSED = {
    "thinking": "400: reasoning blocks have no Chat Completions counterpart",
    "redacted_thinking": "400: no counterpart",
    "server_tool_use / *_tool_result / container_upload / mcp_*": "400: server tools",
}

FIELDS: dict[str, dict[str, str]] = {
    "request": TOP, "messages[]": MESSAGE, "text block": TEXT, "image block": IMAGE,
    "document block": DOCUMENT, "search_result block": SEARCH_RESULT,
    "tool_result block": TOOL_RESULT, "tool_use block": TOOL_USE, "tools[]": TOOL,
    "tool_choice": TOOL_CHOICE, "metadata": METADATA, "other blocks": BLOCKS_REFUSED}


def _text_part(b: dict[str, Any], p: str) -> Part:
    known_keys(b, TEXT, p)
    cites = b.get("citations")
    if cites is not None and arr(cites, p + ".citations"):
        refuse(p + ".citations", "citations of earlier answers have no counterpart")
    return {"type": "text", "text": string(b.get("text"), p + ".text")}


def _image_part(b: dict[str, Any], p: str) -> Part:
    known_keys(b, IMAGE, p)
    src = obj(b.get("source"), p + ".source")
    kind = src.get("type")
    if kind == "base64":
        known_keys(src, ("type", "media_type", "data"), p + ".source")
        media = string(src.get("media_type"), p + ".source.media_type")
        url = f"data:{media};base64,{string(src.get('data'), p + '.source.data')}"
    elif kind == "url":
        known_keys(src, ("type", "url"), p + ".source")
        url = string(src.get("url"), p + ".source.url")
    else:
        refuse(p + ".source.type", f"image source {kind!r} has no counterpart (base64 and url do)")
    return {"type": "image_url", "image_url": {"url": url}}


def _citations_off(b: dict[str, Any], p: str) -> None:
    c = b.get("citations")
    if c is None:
        return
    known_keys(obj(c, p + ".citations"), ("enabled",), p + ".citations")
    if boolean(c.get("enabled", False), p + ".citations.enabled"):
        refuse(p + ".citations", "answers with citations have no counterpart")


def _document_parts(b: dict[str, Any], p: str) -> list[Part]:
    known_keys(b, DOCUMENT, p)
    _citations_off(b, p)
    src = obj(b.get("source"), p + ".source")
    title = None if b.get("title") is None else string(b["title"], p + ".title")
    context = None if b.get("context") is None else string(b["context"], p + ".context")
    kind = src.get("type")
    attrs = {"title": title, "context": context}
    if kind == "base64" and src.get("media_type") == "application/pdf":
        known_keys(src, ("type", "media_type", "data"), p + ".source")
        data = string(src.get("data"), p + ".source.data")
        pdf = {"type": "file", "file": {"filename": title or "document.pdf",
                                        "file_data": f"data:application/pdf;base64,{data}"}}
        if context is None:
            return [pdf]
        # the wrapper names the title too, before the context (the block's own order)
        return [{"type": "text", "text": open_tag("document", attrs)}, pdf,
                {"type": "text", "text": close_tag("document")}]
    if kind == "text":
        known_keys(src, ("type", "media_type", "data"), p + ".source")
        inner = [{"type": "text", "text": string(src.get("data"), p + ".source.data")}]
        attrs["media_type"] = src.get("media_type")
    elif kind == "content":
        known_keys(src, ("type", "content"), p + ".source")
        inner = _inner_parts(src.get("content"), p + ".source.content")
    else:
        refuse(p + ".source.type", f"document source {kind!r} has no counterpart (text, "
               "content and base64 PDF do)")
    return [{"type": "text", "text": open_tag("document", attrs)}, *inner,
            {"type": "text", "text": close_tag("document")}]


def _search_result_parts(b: dict[str, Any], p: str) -> list[Part]:
    known_keys(b, SEARCH_RESULT, p)
    _citations_off(b, p)
    attrs = {"source": string(b.get("source"), p + ".source"),
             "title": string(b.get("title"), p + ".title")}
    inner = [_text_part(obj(t, f"{p}.content[{i}]"), f"{p}.content[{i}]")
             for i, t in enumerate(arr(b.get("content"), p + ".content"))]
    return [{"type": "text", "text": open_tag("search_result", attrs)}, *inner,
            {"type": "text", "text": close_tag("search_result")}]


def _inner_parts(content: Any, p: str, *, images: bool = True) -> list[Part]:
    """Blocks nested in a document or a tool result -> parts (text, images when allowed)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out: list[Part] = []
    for i, b in enumerate(arr(content, p)):
        q = f"{p}[{i}]"
        kind = obj(b, q).get("type")
        if kind == "text":
            out.append(_text_part(b, q))
        elif kind == "image" and images:
            out.append(_image_part(b, q))
        elif kind == "document":
            out += _document_parts(b, q)
        elif kind == "search_result":
            out += _search_result_parts(b, q)
        else:
            refuse(q + ".type", f"a {kind!r} block here has no counterpart")
    return out


def _tool_message(b: dict[str, Any], p: str) -> dict[str, Any]:
    known_keys(b, TOOL_RESULT, p)
    parts = [] if b.get("content") is None else _inner_parts(b["content"], p + ".content",
                                                             images=False)
    if any(x["type"] != "text" for x in parts):
        refuse(p + ".content", "a tool message carries text only (no images or files)")
    if b.get("is_error") is not None and boolean(b["is_error"], p + ".is_error"):
        parts = [{"type": "text", "text": open_tag("tool_error")}, *parts,
                 {"type": "text", "text": close_tag("tool_error")}]
    return {"role": "tool", "tool_call_id": string(b.get("tool_use_id"), p + ".tool_use_id"),
            "content": _collapse(parts) if parts else ""}


def _collapse(parts: list[Part]) -> str | list[Part]:
    """One text part -> its string (the same content); anything else stays a list of parts."""
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _user_messages(content: Any, p: str, origins: dict[int, str]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_msgs: list[dict[str, Any]] = []
    parts: list[Part] = []
    for i, b in enumerate(arr(content, p)):
        q = f"{p}[{i}]"
        kind = obj(b, q).get("type")
        if kind == "tool_result":
            if parts:
                refuse(q, "tool_result blocks must come first in a user turn (as the Messages "
                       "API requires); here one follows other content")
            tool_msgs.append(_tool_message(b, q))
            origins[id(tool_msgs[-1])] = q
        elif kind == "text":
            parts.append(_text_part(b, q))
        elif kind == "image":
            parts.append(_image_part(b, q))
        elif kind == "document":
            parts += _document_parts(b, q)
        elif kind == "search_result":
            parts += _search_result_parts(b, q)
        else:
            refuse(q + ".type", f"a {kind!r} block in a user turn has no counterpart")
    return tool_msgs + ([{"role": "user", "content": _collapse(parts)}] if parts else [])


def _assistant_message(content: Any, p: str, origins: dict[int, str]) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    parts: list[Part] = []
    calls: list[dict[str, Any]] = []
    for i, b in enumerate(arr(content, p)):
        q = f"{p}[{i}]"
        kind = obj(b, q).get("type")
        if kind == "text":
            if calls:
                refuse(q, "text after a tool_use block: an assistant message puts its text "
                       "before its tool calls, so the order would be lost")
            parts.append(_text_part(b, q))
        elif kind == "tool_use":
            known_keys(b, TOOL_USE, q)
            args = exactjson.dumps(obj(b.get("input"), q + ".input")).decode()
            calls.append({"id": string(b.get("id"), q + ".id"), "type": "function",
                          "function": {"name": string(b.get("name"), q + ".name"),
                                       "arguments": args}})
            origins[id(calls[-1])] = q
        else:
            refuse(q + ".type", f"a {kind!r} block in an assistant turn has no counterpart")
    msg: dict[str, Any] = {"role": "assistant",
                           "content": _collapse(parts) if parts else (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system(system: Any, p: str = "system") -> list[dict[str, Any]]:
    """The top-level ``system`` (``p`` = ``"system"``) or a mid-conversation system message's
    content (``p`` = ``"messages[i].content"``) -> one Chat system message, or none when empty."""
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    parts = []
    for i, b in enumerate(arr(system, p)):
        q = f"{p}[{i}]"
        if obj(b, q).get("type") != "text":
            refuse(q + ".type", "system blocks are text blocks")
        parts.append(_text_part(b, q))
    return [{"role": "system", "content": _collapse(parts)}] if parts else []


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(arr(tools, "tools")):
        q = f"tools[{i}]"
        known_keys(obj(t, q), TOOL, q)
        if t.get("type", "custom") not in ("custom", None):
            refuse(q + ".type", f"server tool {t.get('type')!r} runs on Anthropic's side")
        fn: dict[str, Any] = {"name": string(t.get("name"), q + ".name")}
        if t.get("description") is not None:
            fn["description"] = string(t["description"], q + ".description")
        fn["parameters"] = obj(t.get("input_schema"), q + ".input_schema")
        if t.get("strict") is not None:
            fn["strict"] = boolean(t["strict"], q + ".strict")
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc: Any, out: dict[str, Any]) -> None:
    known_keys(obj(tc, "tool_choice"), TOOL_CHOICE, "tool_choice")
    kind = tc.get("type")
    if kind == "tool":
        out["tool_choice"] = {"type": "function",
                              "function": {"name": string(tc.get("name"), "tool_choice.name")}}
    elif kind in ("auto", "any", "none"):
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        refuse("tool_choice.type", f"unknown tool_choice type {kind!r}")
    if tc.get("disable_parallel_tool_use") is not None:  # sent as given, false too
        out["parallel_tool_calls"] = not boolean(tc["disable_parallel_tool_use"],
                                                 "tool_choice.disable_parallel_tool_use")


def _refuse_server_side(body: dict[str, Any]) -> None:
    for key in ("container", "context_management", "mcp_servers", "output_config",
                "output_format", "inference_geo"):
        if body.get(key) is not None:
            refuse(key, TOP[key].removeprefix("400: "))
    thinking = body.get("thinking")
    if thinking is not None and obj(thinking, "thinking").get("type") != "disabled":
        refuse("thinking", "extended thinking has no Chat Completions counterpart")
    tier = body.get("service_tier")
    if tier is not None and tier not in ("auto", "standard_only"):
        refuse("service_tier", f"unknown service tier {tier!r}")


def _note(origins: dict[int, str], msgs: list[dict[str, Any]], param: str) -> None:
    """Record ``param`` as the client origin of each new message and its tool calls (the
    calls' own ``param``s were recorded by :func:`_assistant_message`)."""
    for m in msgs:
        origins.setdefault(id(m), param)
        for c in m.get("tool_calls") or ():
            origins.setdefault(id(c), param)


def request_to_openai(body: dict[str, Any], origins: dict[int, str] | None = None
                      ) -> dict[str, Any]:
    """Anthropic Messages request -> Chat Completions request (see module docstring).

    ``origins``, when given, is filled with ``id()`` of each Chat Completions message / tool
    call -> the client param it came from (for :mod:`prefixgate.proxy.bridges.validity`'s errors). Raises
    InvalidRequest (400, ``param`` = the field's path) for any field it cannot carry."""
    known_keys(body, TOP, "")
    _refuse_server_side(body)
    origins = {} if origins is None else origins
    out: dict[str, Any] = {"model": string(body.get("model"), "model")}
    messages = _system(body["system"]) if body.get("system") is not None else []
    _note(origins, messages, "system")
    for i, m in enumerate(arr(body.get("messages"), "messages")):
        p = f"messages[{i}]"
        known_keys(obj(m, p), MESSAGE, p)
        role = m.get("role")
        if role == "assistant":
            messages.append(_assistant_message(m.get("content"), p + ".content", origins))
            _note(origins, messages[-1:], p + ".content")
        elif role == "user":
            new = _user_messages(m.get("content"), p + ".content", origins)
            _note(origins, new, p + ".content")
            messages.extend(new)
        elif role == "system":  # a mid-conversation system message: carried in place
            new = _system(m.get("content"), p + ".content")
            if not new:
                refuse(p + ".content", "an empty system message has no counterpart")
            _note(origins, new, p + ".content")
            messages.extend(new)
        else:
            refuse(p + ".role", f"role {role!r}: the Messages API has user, assistant and "
                   "system messages")
    out["messages"] = messages
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], out)
    out["max_tokens"] = integer(body.get("max_tokens"), "max_tokens")
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = number(body[key], key)
    if body.get("top_k") is not None:
        out["top_k"] = integer(body["top_k"], "top_k")
    if body.get("stop_sequences") is not None:
        stops = arr(body["stop_sequences"], "stop_sequences")
        out["stop"] = [string(s, f"stop_sequences[{i}]") for i, s in enumerate(stops)]
    if body.get("metadata") is not None:
        known_keys(obj(body["metadata"], "metadata"), METADATA, "metadata")
        if body["metadata"].get("user_id") is not None:
            out["user"] = string(body["metadata"]["user_id"], "metadata.user_id")
    for key in ("prompt_cache_key", "prompt_cache_retention"):  # cache routing hints
        if body.get(key) is not None:
            out[key] = string(body[key], key)
    if body.get("service_tier") is not None:  # checked by _refuse_server_side
        out["service_tier"] = {"standard_only": "default"}.get(body["service_tier"], "auto")
    if body.get("stream") is not None and boolean(body["stream"], "stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out
