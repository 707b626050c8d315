"""O->A request: a Chat Completions body -> a Messages body, lossless or refused.

Every key the Chat Completions API allows is in one of the field tables below (``FIELDS``
gathers them for ``docs/bridges.md``); each is mapped to its Messages counterpart, carried as
text between explicit delimiters (``<system>`` ... ``</system>`` for a system message in the
middle of the conversation), or refused with a 400 naming it (:mod:`prefixgate.proxy.bridges.fields`).
Fields whose value means "the default" on both APIs (``n: 1``, ``seed: null``, ``logprobs:
false``) are mapped by leaving them out. A key no table names is refused. Everything the bridge
or its stream mapper reads is checked here, before anything is sent. Sources: OpenAI Chat
Completions reference (create) and Anthropic Messages API reference (create message).
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
    only_default,
    open_tag,
    refuse,
    string,
)
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.nesting import DEFAULT_MAX_JSON_DEPTH, check_nested_text

Block = dict[str, Any]
DEFAULT_MAX_TOKENS = 4096

TOP = {
    "model": "mapped: model",
    "messages": "mapped: system + messages (see the message tables)",
    "max_completion_tokens": "mapped: max_tokens (the same integer, 0 included)",
    "max_tokens": "mapped: max_tokens (both given and different: 400; neither: 4096, "
                  "which the Messages API requires)",
    "temperature": "mapped: temperature", "top_p": "mapped: top_p",
    "top_k": "mapped: top_k (vLLM-style extension)",
    "stop": "mapped: stop_sequences (a string becomes a one-item list)",
    "stream": "mapped: stream",
    "stream_options": "mapped: include_usage -> the final usage chunk; include_obfuscation: "
                      "no padding is ever added (checked, not sent); without stream: "
                      "nothing to do (a non-streamed answer always has usage)",
    "tools": "mapped: tools (function tools); custom tools: 400",
    "tool_choice": "mapped: tool_choice (required -> any); allowed_tools / custom: 400",
    "parallel_tool_calls": "mapped: tool_choice.disable_parallel_tool_use = not it; "
                           "without tools: 400 (as Chat Completions answers); with tool_choice "
                           "none: no tool call is made, nothing to carry",
    "functions": "mapped: tools (deprecated form); together with tools: 400",
    "function_call": "mapped: tool_choice (deprecated form); together with tool_choice: 400",
    "user": "mapped: metadata.user_id",
    "safety_identifier": "mapped: metadata.user_id (with a different user: 400)",
    "service_tier": "auto -> auto, default -> standard_only; flex / priority / scale: 400",
    "prompt_cache_key": "mapped: automatic prefix caching (a routing hint; answer unchanged)",
    "prompt_cache_retention": "mapped: automatic prefix caching (answer unchanged)",
    "n": "1 / null: mapped (the only Messages behaviour); other: 400",
    "seed": "null: mapped; a seed: 400 (no deterministic sampling)",
    "response_format": "null / {type: text}: mapped; json_object / json_schema: 400",
    "frequency_penalty": "null / 0: mapped; other: 400",
    "presence_penalty": "null / 0: mapped; other: 400",
    "logit_bias": "null / {}: mapped; other: 400",
    "logprobs": "null / false: mapped; true: 400",
    "top_logprobs": "null / 0: mapped; other: 400",
    "modalities": "null / [\"text\"]: mapped; audio: 400",
    "audio": "null: mapped; audio output: 400",
    "prediction": "null: mapped; predicted outputs: 400",
    "reasoning_effort": "null: mapped; other: 400 (no exact counterpart)",
    "verbosity": "null: mapped; other: 400",
    "web_search_options": "null: mapped; web search: 400",
    "store": "null / false: mapped; true: 400 (nothing is stored)",
    "metadata": "null / {}: mapped; other: 400 (no stored completions)",
}
SYSTEM_MSG = {"role": "system / developer",
              "content": "leading system turns -> system (string, or one text block per "
                         "message / part, cache_control kept); later ones: carried as "
                         "<system> ... </system> (<developer> ...) text in a user turn, in place",
              "name": "400: no counterpart"}
USER_MSG = {"role": "user", "content": "mapped: user content (string -> text block)",
            "name": "400: no counterpart"}
ASSISTANT_MSG = {"role": "assistant", "content": "mapped: text blocks",
                 "refusal": "carried: <refusal> ... </refusal> text block",
                 "tool_calls": "mapped: tool_use blocks (arguments -> input, numbers exact; "
                               "not a JSON object: {\"_raw\": text}); custom calls: 400",
                 "function_call": "mapped: a tool_use block with id call_<message index>",
                 "name": "400: no counterpart", "audio": "null: mapped; audio: 400"}
TOOL_MSG = {"role": "tool", "tool_call_id": "mapped: tool_result.tool_use_id",
            "content": "mapped: tool_result.content (string, or text blocks)"}
FUNCTION_MSG = {"role": "function (deprecated)",
                "name": "mapped: the tool_result of the latest function_call of that name "
                        "(none: 400)",
                "content": "mapped: tool_result.content"}
TEXT_PART = {"type": "text (input_text)", "text": "mapped: a text block",
             "cache_control": "mapped: cache_control (extension Anthropic clients send)"}
IMAGE_PART = {"type": "image_url",
              "image_url": "url: data: URL -> base64 source, else url source; detail auto / "
                           "high: mapped (full resolution), low: 400"}
FILE_PART = {"type": "file", "file": "file_data PDF -> document block (filename -> title); "
                                     "file_id or another media type: 400"}
REFUSAL_PART = {"type": "refusal", "refusal": "carried: <refusal> ... </refusal> text block"}
AUDIO_PART = {"type": "input_audio", "input_audio": "400: audio input has no counterpart"}
TOOL_DEF = {"type": "function: mapped; custom: 400",
            "function": "name -> name, description -> description, parameters -> "
                        "input_schema (absent: an empty object schema), strict -> strict",
            "cache_control": "mapped: the tool's cache_control (extension Anthropic clients "
                             "send)"}

FIELDS: dict[str, dict[str, str]] = {
    "request": TOP, "system / developer message": SYSTEM_MSG, "user message": USER_MSG,
    "assistant message": ASSISTANT_MSG, "tool message": TOOL_MSG,
    "function message": FUNCTION_MSG, "text part": TEXT_PART, "image_url part": IMAGE_PART,
    "file part": FILE_PART, "refusal part": REFUSAL_PART, "input_audio part": AUDIO_PART,
    "tools[]": TOOL_DEF}

_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "seed": (None,), "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "logprobs": (None, False),
    "top_logprobs": (None, 0), "modalities": (None, ["text"]), "audio": (None,),
    "prediction": (None,), "reasoning_effort": (None,), "verbosity": (None,),
    "web_search_options": (None,), "store": (None, False), "metadata": (None, {})}


def _text_block(p: dict[str, Any], q: str) -> Block:
    known_keys(p, TEXT_PART, q)
    block: Block = {"type": "text", "text": string(p.get("text"), q + ".text")}
    if "cache_control" in p:
        block["cache_control"] = obj(p["cache_control"], q + ".cache_control")
    return block


def _image_block(p: dict[str, Any], q: str) -> Block:
    known_keys(p, IMAGE_PART, q)
    iu = obj(p.get("image_url"), q + ".image_url")
    known_keys(iu, ("url", "detail"), q + ".image_url")
    if iu.get("detail") not in (None, "auto", "high"):
        refuse(q + ".image_url.detail", "Messages reads images at full resolution only")
    url = string(iu.get("url"), q + ".image_url.url")
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": head or "image/png",
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _file_block(p: dict[str, Any], q: str) -> Block:
    known_keys(p, FILE_PART, q)
    f = obj(p.get("file"), q + ".file")
    known_keys(f, ("file_data", "file_id", "filename"), q + ".file")
    if f.get("file_id") is not None:
        refuse(q + ".file.file_id", "uploaded file ids belong to the client's OpenAI account")
    data = string(f.get("file_data"), q + ".file.file_data")
    prefix = "data:application/pdf;base64,"
    if not data.startswith(prefix):
        refuse(q + ".file.file_data", "only PDF data URLs have a counterpart (document block)")
    block: Block = {"type": "document", "source": {"type": "base64",
                                                   "media_type": "application/pdf",
                                                   "data": data[len(prefix):]}}
    if f.get("filename") is not None:
        block["title"] = string(f["filename"], q + ".file.filename")
    return block


def _refusal_block(text: Any, q: str) -> Block:
    return {"type": "text", "text": open_tag("refusal") + string(text, q) + close_tag("refusal")}


def blocks(content: Any, q: str, *, assistant: bool = False) -> list[Block]:
    """OpenAI ``content`` (string, parts or null) -> Anthropic blocks; an empty string is no
    block (nothing to carry). ``q``: the path of ``content``. Raises InvalidRequest."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[Block] = []
    for i, p in enumerate(arr(content, q)):
        r = f"{q}[{i}]"
        kind = obj(p, r).get("type")
        if kind in ("text", "input_text"):
            block = _text_block(p, r)
            if block["text"]:  # an empty part carries nothing (and Messages rejects one)
                out.append(block)
        elif kind == "refusal" and assistant:
            known_keys(p, REFUSAL_PART, r)
            out.append(_refusal_block(p.get("refusal"), r + ".refusal"))
        elif kind == "image_url" and not assistant:
            out.append(_image_block(p, r))
        elif kind == "file" and not assistant:
            out.append(_file_block(p, r))
        else:
            refuse(r + ".type", f"a {kind!r} content part here has no Messages counterpart")
    return out


def _tool_use(call: Any, q: str, max_depth: int) -> Block:
    known_keys(obj(call, q), ("id", "type", "function"), q)
    if call.get("type", "function") != "function":
        refuse(q + ".type", f"{call.get('type')!r} tool calls have no counterpart")
    fn = obj(call.get("function"), q + ".function")
    known_keys(fn, ("name", "arguments"), q + ".function")
    return {"type": "tool_use", "id": string(call.get("id"), q + ".id"),
            "name": string(fn.get("name"), q + ".function.name"),
            "input": tool_input(string(fn.get("arguments", "{}"), q + ".function.arguments"),
                                q + ".function.arguments", max_depth)}


def tool_input(arguments: str, param: str = "arguments",
               max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> dict[str, Any]:
    """``arguments`` JSON text -> a tool_use ``input`` object, numbers exact. Text that is not
    a JSON object is carried whole as ``{"_raw": text}``. JSON nested deeper than ``max_depth``
    (policy ``limits.max_json_depth``, the body's own bound) raises NestingTooDeep (400,
    ``param``): parsed, it would make the translated body deeper than the limit allows."""
    try:
        args = exactjson.loads(arguments or "{}")
    except ValueError:
        check_nested_text(None, arguments, max_depth, param)
        return {"_raw": arguments}
    check_nested_text(args, arguments, max_depth, param)
    return args if isinstance(args, dict) else {"_raw": arguments}


def _text_blocks(content: Any, q: str) -> list[Block]:
    """Content of a system, developer, tool or function message: text only."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out = []
    for i, p in enumerate(arr(content, q)):
        r = f"{q}[{i}]"
        if obj(p, r).get("type") not in ("text", "input_text"):
            refuse(r + ".type", "this message holds text parts only")
        out.append(_text_block(p, r))
    return out


class _Turns:
    """Anthropic turns being built: consecutive same-role blocks merge into one turn (as the
    Messages API itself combines consecutive turns); legacy function calls wait for their
    ``function`` result by name."""

    def __init__(self, max_depth: int, origins: dict[int, str]) -> None:
        self.turns: list[dict[str, Any]] = []
        self.pending: dict[str, str] = {}  # function name -> tool_use id of its function_call
        self.max_depth = max_depth
        self.origins = origins  # id() of a turn / block -> the client param it came from

    def add(self, role: str, new: list[Block], src: str) -> None:
        for b in new:
            self.origins.setdefault(id(b), src)
        if not new:
            return
        if self.turns and self.turns[-1]["role"] == role:
            self.turns[-1]["content"].extend(new)
        else:
            self.turns.append({"role": role, "content": new})
            self.origins[id(self.turns[-1])] = src

    def assistant(self, m: dict[str, Any], q: str, index: int) -> None:
        known_keys(m, ASSISTANT_MSG, q)
        for key in ("name", "audio"):
            if m.get(key) is not None:
                refuse(f"{q}.{key}", ASSISTANT_MSG[key].removeprefix("null: mapped; "))
        out = blocks(m.get("content"), q + ".content", assistant=True)
        if m.get("refusal") is not None:
            out.append(_refusal_block(m["refusal"], q + ".refusal"))
        if m.get("tool_calls") is not None:
            calls = [_tool_use(c, f"{q}.tool_calls[{j}]", self.max_depth)
                     for j, c in enumerate(arr(m["tool_calls"], q + ".tool_calls"))]
            self.origins.update((id(b), f"{q}.tool_calls[{j}]") for j, b in enumerate(calls))
            out += calls
        if m.get("function_call") is not None:
            fc = obj(m["function_call"], q + ".function_call")
            known_keys(fc, ("name", "arguments"), q + ".function_call")
            name = string(fc.get("name"), q + ".function_call.name")
            self.pending[name] = f"call_{index}"
            out.append({"type": "tool_use", "id": f"call_{index}", "name": name,
                        "input": tool_input(string(fc.get("arguments", "{}"),
                                                   q + ".function_call.arguments"),
                                            q + ".function_call.arguments", self.max_depth)})
        self.add("assistant", out, q + ".content" if m.get("content") else q)

    def tool_result(self, m: dict[str, Any], q: str, role: str) -> None:
        known_keys(m, TOOL_MSG if role == "tool" else FUNCTION_MSG, q)
        if role == "tool":
            call_id = string(m.get("tool_call_id"), q + ".tool_call_id")
        else:
            name = string(m.get("name"), q + ".name")
            if name not in self.pending:
                refuse(q, f"a function message for {name!r} with no function_call before it")
            call_id = self.pending.pop(name)
        content = m.get("content")
        result = content if isinstance(content, str) else _text_blocks(content, q + ".content")
        self.add("user", [{"type": "tool_result", "tool_use_id": call_id, "content": result}], q)


def _messages(msgs: list[Any], out: dict[str, Any], max_depth: int,
              origins: dict[int, str]) -> None:
    turns = _Turns(max_depth, origins)
    system: list[tuple[Any, list[Block]]] = []
    leading = True
    for i, m in enumerate(msgs):
        q = f"messages[{i}]"
        role = obj(m, q).get("role")
        if role in ("system", "developer"):
            known_keys(m, SYSTEM_MSG, q)
            if m.get("name") is not None:
                refuse(q + ".name", "messages have no participant names in the Messages API")
            content = [b for b in _text_blocks(m.get("content"), q + ".content")
                       if b["text"] or "cache_control" in b]  # an empty part carries nothing
            if leading:
                origins.update((id(b), q + ".content") for b in content)
                system.append((m.get("content"), content))
            elif content:  # later: in place, delimited
                turns.add("user", [{"type": "text", "text": open_tag(role)}, *content,
                                   {"type": "text", "text": close_tag(role)}], q + ".content")
            continue
        leading = False
        if role == "user":
            known_keys(m, USER_MSG, q)
            if m.get("name") is not None:
                refuse(q + ".name", "messages have no participant names in the Messages API")
            turns.add("user", blocks(m.get("content"), q + ".content"), q + ".content")
        elif role == "assistant":
            turns.assistant(m, q, i)
        elif role in ("tool", "function"):
            turns.tool_result(m, q, role)
        else:
            refuse(q + ".role", f"role {role!r} has no Messages counterpart")
    if len(system) == 1 and isinstance(system[0][0], str) and system[0][0]:
        out["system"] = system[0][0]
    elif any(b for _, b in system):
        out["system"] = [b for _, bs in system for b in bs]
    out["messages"] = turns.turns


def _tool_def(t: Any, q: str) -> dict[str, Any]:
    fn = obj(t, q)
    if "function" in fn or "type" in fn:  # tools[] item; functions[] items are bare
        known_keys(fn, TOOL_DEF, q)
        if fn.get("type", "function") != "function":
            refuse(q + ".type", f"{fn.get('type')!r} tools have no counterpart")
        q += ".function"
        fn = obj(fn.get("function"), q)
    known_keys(fn, ("name", "description", "parameters", "strict"), q)
    tool: dict[str, Any] = {"name": string(fn.get("name"), q + ".name")}
    if fn.get("description") is not None:
        tool["description"] = string(fn["description"], q + ".description")
    tool["input_schema"] = (obj(fn["parameters"], q + ".parameters") if fn.get("parameters")
                            is not None else {"type": "object", "properties": {}})
    if fn.get("strict") is not None:
        tool["strict"] = boolean(fn["strict"], q + ".strict")
    if isinstance(t, dict) and "cache_control" in t and fn is not t:
        tool["cache_control"] = obj(t["cache_control"], q.removesuffix(".function")
                                    + ".cache_control")
    return tool


def _tool_choice(tc: Any, q: str) -> dict[str, Any]:
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            refuse(q, f"unknown tool_choice {tc!r}")
        return {"type": {"required": "any"}.get(tc, tc)}
    kind = obj(tc, q).get("type", "function" if q == "function_call" else None)
    if kind != "function":
        refuse(q + ".type", f"tool_choice {kind!r} has no counterpart")
    if q == "function_call":
        known_keys(tc, ("name",), q)
        return {"type": "tool", "name": string(tc.get("name"), q + ".name")}
    known_keys(tc, ("type", "function"), q)
    fn = obj(tc.get("function"), q + ".function")
    known_keys(fn, ("name",), q + ".function")
    return {"type": "tool", "name": string(fn.get("name"), q + ".function.name")}


def _tools(body: dict[str, Any], out: dict[str, Any]) -> None:
    for new, old in (("tools", "functions"), ("tool_choice", "function_call")):
        if body.get(new) is not None and body.get(old) is not None:
            refuse(old, f"give {new} or the deprecated {old}, not both")
    key = "tools" if body.get("tools") is not None else "functions"
    if body.get(key) is not None:
        out["tools"] = [_tool_def(t, f"{key}[{i}]") for i, t in enumerate(arr(body[key], key))]
    key = "tool_choice" if body.get("tool_choice") is not None else "function_call"
    if body.get(key) is not None:
        out["tool_choice"] = _tool_choice(body[key], key)
    if body.get("parallel_tool_calls") is not None:
        parallel = boolean(body["parallel_tool_calls"], "parallel_tool_calls")
        if "tools" not in out:  # as the Chat Completions API itself answers
            refuse("parallel_tool_calls", "it is only allowed when tools are given (there is "
                   "no tool call to run in parallel, and nowhere to carry it)")
        choice = out.setdefault("tool_choice", {"type": "auto"})
        if choice["type"] != "none":  # sent as given, true (the default) too
            choice["disable_parallel_tool_use"] = not parallel


def _max_tokens(body: dict[str, Any]) -> int:
    given = [(k, integer(body[k], k)) for k in ("max_completion_tokens", "max_tokens")
             if body.get(k) is not None]
    if len(given) == 2 and given[0][1] != given[1][1]:
        refuse("max_tokens", "max_completion_tokens and max_tokens differ; give one")
    return given[0][1] if given else DEFAULT_MAX_TOKENS


def _stream(body: dict[str, Any], out: dict[str, Any]) -> None:
    stream = body.get("stream") is not None and boolean(body["stream"], "stream")
    if stream:
        out["stream"] = True
    opts = body.get("stream_options")
    if opts is None:
        return
    known_keys(obj(opts, "stream_options"), ("include_usage", "include_obfuscation"),
               "stream_options")
    for k in ("include_usage", "include_obfuscation"):
        if opts.get(k) is not None:
            boolean(opts[k], f"stream_options.{k}")


def _identity(body: dict[str, Any], out: dict[str, Any]) -> None:
    ids = {k: string(body[k], k) for k in ("user", "safety_identifier")
           if body.get(k) is not None}
    if len(set(ids.values())) > 1:
        refuse("safety_identifier", "user and safety_identifier differ; the Messages API "
               "has one metadata.user_id")
    if ids:
        out["metadata"] = {"user_id": next(iter(ids.values()))}
    tier = body.get("service_tier")
    if tier is not None:
        if tier not in ("auto", "default"):
            refuse("service_tier", f"service tier {tier!r} has no counterpart")
        out["service_tier"] = "auto" if tier == "auto" else "standard_only"


def request_to_anthropic(body: dict[str, Any], max_depth: int = DEFAULT_MAX_JSON_DEPTH,
                         origins: dict[int, str] | None = None) -> dict[str, Any]:
    """Chat Completions request -> Messages request (see module docstring).

    ``max_depth``: policy ``limits.max_json_depth``, applied to the tool-call ``arguments`` it
    parses. ``origins``, when given, is filled with ``id()`` of each Messages turn / block ->
    the client param it came from (for :mod:`prefixgate.proxy.bridges.validity`'s errors). Raises
    InvalidRequest (400, ``param`` = the field's path) for any field it cannot carry,
    NestingTooDeep (400) for arguments nested deeper than ``max_depth``."""
    known_keys(body, TOP, "")
    for key, defaults in _DEFAULT_ONLY.items():
        only_default(body, key, defaults)
    if body.get("response_format") is not None:
        fmt = obj(body["response_format"], "response_format")
        if fmt != {"type": "text"}:
            refuse("response_format", "JSON modes have no exact Messages counterpart")
    out: dict[str, Any] = {"model": string(body.get("model"), "model"),
                           "max_tokens": _max_tokens(body)}
    _messages(arr(body.get("messages"), "messages"), out, max_depth,
              {} if origins is None else origins)
    _tools(body, out)
    for k in ("temperature", "top_p"):
        if body.get(k) is not None:
            out[k] = number(body[k], k)
    if body.get("top_k") is not None:
        out["top_k"] = integer(body["top_k"], "top_k")
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else arr(stop, "stop")
        out["stop_sequences"] = [string(s, f"stop[{i}]") for i, s in enumerate(stops)]
    _identity(body, out)
    _stream(body, out)
    return out
