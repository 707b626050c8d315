"""The Responses API bridged to Chat Completions: request items -> messages, answer -> Response.

Pure dict-to-dict functions (no I/O), used by the bridge object
:class:`prefixgate.proxy.bridges.responses_chat.ResponsesToChat` for backends that speak Chat Completions
(our engine, vLLM, SGLang; Anthropic through the O->A bridge after this one).
Shapes follow the OpenAI Responses reference and the Open Responses spec (``ResponseResource``).

Request (:func:`to_chat`), every field mapped, ignored because it only describes the answer, or
refused with a 400 naming it:

- ``instructions`` -> first ``system`` message (not carried to the next response of a chain,
  as OpenAI does); ``input`` string -> one user message; ``input`` items:
  ``message`` (role ``developer`` -> ``system``; parts ``input_text`` / ``output_text`` /
  ``refusal`` -> text parts, ``input_image`` -> ``image_url``), ``function_call`` -> an assistant
  message's ``tool_calls`` (consecutive calls share one message), ``function_call_output`` ->
  a ``tool`` message, ``reasoning`` -> not sent (a Chat Completions backend takes no reasoning
  input; its summary text stays in the response store).
- ``tools`` (``function`` only) -> Chat ``tools``; ``tool_choice``; ``max_output_tokens`` ->
  ``max_tokens``; ``temperature``, ``top_p``, ``parallel_tool_calls``, ``user``;
  ``text.format`` ``json_schema`` / ``json_object`` -> ``response_format``.
  ``prompt_cache_key`` / ``prompt_cache_retention`` / ``safety_identifier`` / ``service_tier``
  as they are; ``reasoning.effort`` -> ``reasoning_effort``; ``text.verbosity`` -> ``verbosity``.
- Refused (400): built-in tools (``web_search``, ``file_search``, ...), ``background: true``,
  item types a Chat backend cannot take (``item_reference``, computer / code calls), and every
  field of :data:`REQUEST_FIELDS` the bridge cannot carry unless it holds its default (``prompt``,
  ``conversation``, ``include``, ``top_logprobs``, ``max_tool_calls``, ``truncation: auto``,
  reasoning summaries); a field not in the table is refused too.

Answer (:func:`response_object`): ``message.reasoning_content`` (vLLM / SGLang reasoning
parsers) -> a ``reasoning`` output item, ``message.content`` -> a ``message`` output item with one
``output_text`` part, ``tool_calls`` -> ``function_call`` items, ``finish_reason: length`` ->
``status: incomplete`` with ``incomplete_details.reason = max_output_tokens``; usage ->
``input_tokens`` / ``input_tokens_details.cached_tokens`` / ``output_tokens``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from prefixgate.proxy.bridges.validity import openai_problem
from prefixgate.proxy.core.errors import InvalidRequest

_BUILTIN_TOOL = "built-in tools run on OpenAI's servers; this backend only takes function tools"


def new_id(prefix: str) -> str:
    """A fresh id: ``prefix`` + ``_`` + 32 hex digits (``resp``, ``msg``, ``fc``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _bad(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"'{param}': {why}.", param=param, code="unsupported_parameter")


def _str(item: dict[str, Any], key: str, param: str, default: str = "") -> str:
    """``item[key]`` when a string (``default`` when absent or null); InvalidRequest (400,
    ``invalid_type``) for any other type: a number or object where the spec has a string
    would otherwise reach the backend, the store and the next turn's history."""
    value = item.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRequest(f"Invalid type for '{param}.{key}': expected a string.",
                             param=f"{param}.{key}", code="invalid_type")
    return value


def _text_of(content: Any, param: str) -> str:
    """Text of a ``function_call_output.output`` (a string or a list of ``input_text``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_str(p, "text", f"{param}[{j}]") for j, p in enumerate(content)
                       if isinstance(p, dict) and p.get("type") in ("input_text", "output_text"))
    raise InvalidRequest(f"'{param}' must be a string or a list of text parts.", param=param,
                         code="invalid_type")


def _part(p: Any, param: str) -> dict[str, Any]:
    if not isinstance(p, dict):
        raise InvalidRequest(f"'{param}' must be an object.", param=param, code="invalid_type")
    kind = p.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": _str(p, "text", param)}
    if kind == "refusal":
        return {"type": "text", "text": _str(p, "refusal", param)}
    if kind == "input_image":
        url = p.get("image_url")
        if not isinstance(url, str):
            raise _bad(param, "only images given by URL or data URL can be bridged (file_id "
                              "names a file stored at OpenAI)")
        return {"type": "image_url", "image_url": {"url": url,
                                                   "detail": _str(p, "detail", param, "auto")}}
    raise _bad(param, f"content part type {kind!r} cannot be bridged to Chat Completions")


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(f"'{param}.role' must be user, assistant, system or developer.",
                             param=f"{param}.role", code="invalid_value")
    content = item.get("content")
    if isinstance(content, list):
        parts = [_part(p, f"{param}.content[{j}]") for j, p in enumerate(content)]
        if all(p["type"] == "text" for p in parts) and role != "user":
            content = "".join(p["text"] for p in parts)
        else:
            content = parts
    elif not isinstance(content, str):
        raise InvalidRequest(f"'{param}.content' must be a string or a list of parts.",
                             param=f"{param}.content", code="invalid_type")
    return {"role": "system" if role == "developer" else role, "content": content}


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user ``message`` item). InvalidRequest
    (400) when it is neither."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if isinstance(raw, list) and all(isinstance(i, dict) for i in raw):
        return list(raw)
    raise InvalidRequest("'input' must be a string or an array of input items.", param="input",
                         code="invalid_type")


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items -> Chat Completions messages (module docstring)."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, param))
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", param) or _str(item, "id", param)
                    or new_id("call"), "type": "function",
                    "function": {"name": _str(item, "name", param),
                                 "arguments": _str(item, "arguments", param) or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and (
                    "tool_calls" in last or not last.get("content")):
                last.setdefault("tool_calls", []).append(call)
                last.setdefault("content", None)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _str(item, "call_id", param),
                        "content": _text_of(item.get("output", ""), f"{param}.output")})
        elif kind == "reasoning":
            continue  # Chat Completions takes no reasoning input (module docstring)
        else:
            raise _bad(f"{param}.type", f"item type {kind!r} cannot be bridged to Chat "
                                         "Completions")
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array.", param="tools", code="invalid_type")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise _bad(f"tools[{i}].type", f"{kind!r}: {_BUILTIN_TOOL}")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise _bad("tool_choice", f"{choice!r} cannot be bridged (function tools only)")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type", "text") == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise _bad("text.format.type", f"{fmt['type']!r} is not a Chat Completions format")


#: What the Responses -> Chat bridge does with each top-level request field (lossless or refuse,
#: issue 20 class 10): ``map`` (carried to the Chat body), ``proxy`` (served by the proxy
#: itself: the response store, the stream), ``default`` (refused unless absent, null or the value
#: that means the same as leaving it out), ``refuse`` (never carried). A field not listed is
#: refused: nothing reaches the backend silently changed, and nothing is dropped.
REQUEST_FIELDS: dict[str, str] = {
    "model": "map", "input": "map", "instructions": "map", "tools": "map", "tool_choice": "map",
    "max_output_tokens": "map", "temperature": "map", "top_p": "map",
    "parallel_tool_calls": "map", "user": "map", "text": "map", "reasoning": "map",
    "prompt_cache_key": "map", "prompt_cache_retention": "map", "safety_identifier": "map",
    "service_tier": "map",
    "stream": "proxy", "stream_options": "proxy", "store": "proxy", "metadata": "proxy",
    "previous_response_id": "proxy", "background": "default",
    "include": "default", "top_logprobs": "default", "max_tool_calls": "default",
    "truncation": "default", "prompt": "default", "conversation": "default",
}
#: The values of the ``default`` fields that mean the same as leaving them out.
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "background": (False,), "include": ([],), "top_logprobs": (0,), "max_tool_calls": (),
    "truncation": ("disabled",), "prompt": (), "conversation": (),
}
_WHY = {
    "include": "a Chat Completions backend cannot add the extra output it asks for",
    "top_logprobs": "the bridged response carries no logprobs",
    "max_tool_calls": "a Chat Completions backend has no limit on tool calls to carry it",
    "truncation": "the proxy does not truncate the conversation for the backend",
    "prompt": "stored prompt templates live at OpenAI",
    "conversation": "conversation objects live at OpenAI; use previous_response_id",
    "background": "background responses need a backend that runs them",
}


def check_fields(body: dict[str, Any]) -> None:
    """Refuse (400, ``param`` naming it) every field of ``body`` the bridge would otherwise drop
    or change (:data:`REQUEST_FIELDS`), and the sub-fields of ``text``, ``reasoning`` and
    ``stream_options`` it cannot carry."""
    for key, value in body.items():
        how = REQUEST_FIELDS.get(key)
        if how is None:
            raise _bad(key, "this field has no Chat Completions counterpart and dropping it would "
                       "change the request")
        if how == "default" and value is not None and not any(
                value == d and type(value) is type(d) for d in DEFAULTS[key]):
            raise _bad(key, _WHY[key])
    _known(body.get("text"), "text", {"format", "verbosity"})
    _known(body.get("reasoning"), "reasoning", {"effort", "summary", "generate_summary"})
    _known(body.get("stream_options"), "stream_options", {"include_obfuscation"})
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) is not None:
            raise _bad(f"reasoning.{key}", "a Chat Completions backend returns no reasoning "
                       "summaries")


def _known(obj: Any, param: str, keys: set[str]) -> None:
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise InvalidRequest(f"Invalid type for '{param}': expected an object.", param=param,
                             code="invalid_type")
    for k in obj:
        if k not in keys:
            raise _bad(f"{param}.{k}", "this field has no Chat Completions counterpart")


def to_chat(body: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """A Chat Completions body for the Responses ``body``; ``history``: the input and output
    items of the ``previous_response_id`` chain, oldest first (empty without one). Raises
    InvalidRequest (400, ``param`` naming the field) for what cannot be bridged."""
    check_fields(body)
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    messages += items_to_messages(history + input_items(body))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p"), ("parallel_tool_calls", "parallel_tool_calls"),
                     ("user", "user"), ("prompt_cache_key", "prompt_cache_key"),
                     ("prompt_cache_retention", "prompt_cache_retention"),
                     ("safety_identifier", "safety_identifier")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if body.get("service_tier") not in (None, "auto", "default"):  # the default: left out
        chat["service_tier"] = body["service_tier"]
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    verbosity = (body.get("text") or {}).get("verbosity")
    if verbosity is not None:
        chat["verbosity"] = verbosity
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    problem = openai_problem(chat)  # the Chat API's rules as a whole: pairing, empty turns
    if problem is not None:
        raise InvalidRequest(f"'input' cannot be bridged to Chat Completions: {problem.why}.",
                             param="input", code="unsupported_parameter")
    return chat


def usage_object(u: Any) -> dict[str, Any]:
    """Chat ``usage`` -> Responses ``usage`` (every required sub-object present; our engine's
    ``prompt_tokens_details.span_reused_tokens``, issue 33, carried into
    ``input_tokens_details`` where it reported one)."""
    u = u if isinstance(u, dict) else {}
    inp, out = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    details = u.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    reasoning = int((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    in_details: dict[str, Any] = {"cached_tokens": cached}
    span = details.get("span_reused_tokens")
    if isinstance(span, int) and not isinstance(span, bool) and span >= 0:
        in_details["span_reused_tokens"] = span
    return {"input_tokens": inp, "input_tokens_details": in_details,
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": inp + out}


def text_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message`` output item holding one ``output_text`` part."""
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_text(text)]}


def output_text(text: str) -> dict[str, Any]:
    """An ``output_text`` content part (no annotations, no logprobs asked)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A ``reasoning`` output item carrying a backend's reasoning text (vLLM / SGLang
    ``reasoning_content``) as one ``reasoning_text`` part; no summary is made."""
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_object(body: dict[str, Any], resp_id: str, created_at: int,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    status: str) -> dict[str, Any]:
    """A ``response`` object (every field the Open Responses ``ResponseResource`` requires),
    echoing the request's settings. ``status``: ``in_progress``, ``completed``,
    ``incomplete`` (cap reached) or ``failed``."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    return {
        "id": resp_id, "object": "response", "created_at": created_at,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": body.get("model", ""),
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "output": output, "error": None,
        "tools": [{"description": None, "parameters": None, "strict": None, **t}
                  for t in tools],
        "tool_choice": body.get("tool_choice", "auto"),
        "truncation": body.get("truncation") or "disabled",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "text": body.get("text") or {"format": {"type": "text"}},
        "top_p": body.get("top_p", 1.0), "temperature": body.get("temperature", 1.0),
        "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "top_logprobs": body.get("top_logprobs") or 0,
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "usage": usage, "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "store": body.get("store", True),
        "background": False, "service_tier": body.get("service_tier") or "default",
        "metadata": body.get("metadata") or {}, "user": body.get("user"),
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }


def output_from_chat(answer: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """A non-streamed ``chat.completion`` -> (output items, status)."""
    choice = (answer.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    thought = msg.get("reasoning_content") or msg.get("reasoning")
    if isinstance(thought, str) and thought:
        output.append(reasoning_item(new_id("rs"), thought))
    text = msg.get("content") or msg.get("refusal")
    if text:
        output.append(text_item(new_id("msg"), text))
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") or {}
        output.append(call_item(new_id("fc"), c.get("id") or new_id("call"),
                                fn.get("name", ""), fn.get("arguments") or "{}"))
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    return output, status
