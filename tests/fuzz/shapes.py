"""Shape checks: a request valid for its API, an error or an answer in the caller's API.

:func:`request_problems` — what an upstream of ``api`` would reject in a request body (required
fields and types, roles, content-block shapes, tool-call pairing, the ≤ 4 ``cache_control``
markers counted wherever Anthropic allows them, tool_result nesting included). Sources: the
OpenAI Chat Completions and Anthropic Messages API references; Anthropic prompt-caching docs for
the breakpoint limit. Each problem is ``"kind:detail"``; kinds are compared between the client's
body and the upstream's, so a client's own invalid request is not blamed on the proxy.

:func:`error_problems` / :func:`answer_problems` — a proxy response in the caller's shape.
"""

from __future__ import annotations

import re
from typing import Any

OPENAI_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
OPENAI_PARTS = {"text", "image_url", "input_audio", "file", "refusal"}
ANTHROPIC_BLOCKS = {"text", "image", "document", "search_result", "tool_use", "tool_result",
                    "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result",
                    "container_upload"}
MAX_BREAKPOINTS = 4


def _is_str(v: Any) -> bool:
    return isinstance(v, str) and type(v).__name__ != "Num"


def _is_int(v: Any) -> bool:
    return type(v).__name__ == "Num" and re.fullmatch(r"-?\d+", str(v)) is not None


def _openai_message(m: Any, i: int, out: list[str]) -> None:
    if not isinstance(m, dict) or m.get("role") not in OPENAI_ROLES:
        out.append(f"bad_role:{i}")
        return
    role, c = m["role"], m.get("content")
    if isinstance(c, list):
        for p in c:
            if not isinstance(p, dict) or p.get("type") not in OPENAI_PARTS:
                out.append(f"bad_part:{role}")
            elif p["type"] == "text" and not _is_str(p.get("text")):
                out.append(f"bad_text:{role}")
        if not c and role != "assistant":
            out.append(f"empty_content:{role}")
    elif c is None:
        if role != "assistant" or not m.get("tool_calls"):
            out.append(f"missing_content:{role}")
    elif not _is_str(c):
        out.append(f"bad_content:{role}")
    if role == "tool" and not _is_str(m.get("tool_call_id")):
        out.append("tool_without_id")
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            out.append("bad_tool_calls")
        else:
            for c2 in calls:
                fn = c2.get("function") if isinstance(c2, dict) else None
                if not (isinstance(fn, dict) and _is_str(fn.get("name")) and _is_str(fn.get("arguments"))
                        and _is_str(c2.get("id"))):
                    out.append("bad_tool_call")


def _openai_pairing(msgs: list[Any], out: list[str]) -> None:
    pending: set[str] = set()
    for m in msgs:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            tid = m.get("tool_call_id")
            if tid in pending:
                pending.discard(tid)
            else:
                out.append("orphan_tool_result")
            continue
        if pending:
            out.append("unanswered_tool_call")
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        pending = {c.get("id") for c in calls if isinstance(c, dict)} if isinstance(calls, list) else set()
    if pending:
        out.append("unanswered_tool_call")


def openai_request_problems(body: Any) -> list[str]:
    """Problems of a Chat Completions request body (see module docstring)."""
    if not isinstance(body, dict):
        return ["not_object"]
    out: list[str] = []
    if not _is_str(body.get("model")):
        out.append("model")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return out + ["messages"]
    for i, m in enumerate(msgs):
        _openai_message(m, i, out)
    _openai_pairing(msgs, out)
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and _is_str(t["function"].get("name"))
            for t in tools)):
        out.append("bad_tools")
    if "stream" in body and not isinstance(body["stream"], bool):
        out.append("bad_stream")
    for key in ("max_tokens", "max_completion_tokens"):
        if key in body and body[key] is not None and (not _is_int(body[key]) or int(str(body[key])) < 1):
            out.append("max_tokens")
    so = body.get("stream_options")
    if so is not None and (not isinstance(so, dict) or body.get("stream") is not True):
        out.append("bad_stream_options")
    return out


def _cache_markers(node: Any) -> int:
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if isinstance(x.get("cache_control"), dict):
                n += 1
            stack.extend(v for k, v in x.items() if k != "cache_control")
        elif isinstance(x, list):
            stack.extend(x)
    return n


def _anthropic_blocks(c: Any, role: str, out: list[str]) -> list[dict[str, Any]]:
    if _is_str(c):
        if not c:
            out.append(f"empty_content:{role}")
        return []
    if not isinstance(c, list) or not c:
        out.append(f"bad_content:{role}")
        return []
    blocks = []
    for b in c:
        if not isinstance(b, dict) or b.get("type") not in ANTHROPIC_BLOCKS:
            out.append(f"bad_block:{role}")
            continue
        if b["type"] == "text" and (not _is_str(b.get("text")) or not b["text"]):
            out.append(f"empty_or_bad_text:{role}")
        if b["type"] in ("tool_use", "server_tool_use") and not isinstance(b.get("input"), dict):
            out.append("tool_use_input_not_object")
        blocks.append(b)
    return blocks


def anthropic_request_problems(body: Any) -> list[str]:
    """Problems of a Messages request body (see module docstring)."""
    if not isinstance(body, dict):
        return ["not_object"]
    out: list[str] = []
    if not _is_str(body.get("model")):
        out.append("model")
    mt = body.get("max_tokens")
    if not _is_int(mt) or int(str(mt)) < 1:
        out.append("max_tokens")
    sysp = body.get("system")
    if sysp is not None and not _is_str(sysp):
        if not isinstance(sysp, list) or any(not isinstance(b, dict) or b.get("type") != "text"
                                             or not _is_str(b.get("text")) for b in sysp):
            out.append("bad_system")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return out + ["messages"]
    prev_calls: set[str] = set()
    for m in msgs:
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            out.append(f"bad_role:{role}")
            continue
        blocks = _anthropic_blocks(m.get("content"), role, out)
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if role == "user":
            if set(results) != prev_calls:
                out.append("tool_pairing")
            seen_other = False
            for b in blocks:
                if b.get("type") != "tool_result":
                    seen_other = True
                elif seen_other:
                    out.append("tool_result_not_first")
        elif prev_calls:
            out.append("tool_pairing")
        prev_calls = {b.get("id") for b in blocks if b.get("type") == "tool_use"} if role == "assistant" else set()
    if _cache_markers({k: v for k, v in body.items() if k in ("tools", "system", "messages")}) > MAX_BREAKPOINTS:
        out.append("too_many_breakpoints")
    if "stream" in body and not isinstance(body["stream"], bool):
        out.append("bad_stream")
    return out


def request_problems(body: Any, api: str) -> list[str]:
    """Problems of a request body for ``api``."""
    return anthropic_request_problems(body) if api == "anthropic" else openai_request_problems(body)


def error_problems(status: int, body: Any, api: str) -> list[str]:
    """Problems of a proxy error answer: its shape in ``api`` and, for a 400, naming the param
    (OpenAI ``error.param``, or a quoted name in the message)."""
    if api == "anthropic":
        ok = isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict) \
            and isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str)
    else:
        ok = isinstance(body, dict) and isinstance(body.get("error"), dict) and isinstance(
            body["error"].get("message"), str) and "type" in body["error"]
    if not ok:
        return ["error_not_in_caller_shape"]
    err = body["error"]
    # a quoted name: one unbroken token (JSON keys may be any text; the proxy escapes
    # whitespace and quotes in it, core.errors.quoted)
    if status == 400 and not err.get("param") and not re.search(r"'[^'\s]+'", err["message"]):
        return ["error_names_no_param"]
    return []


def answer_problems(body: bytes, ctype: str, api: str, stream: bool) -> list[str]:
    """Problems of a 200 answer in ``api``: a JSON message/completion, or a stream that ends
    with its final event (``[DONE]`` / ``message_stop``)."""
    import json

    if stream:
        if not ctype.startswith("text/event-stream"):
            return ["stream_answer_not_sse"]
        text = body.decode("utf-8", "replace")
        if api == "openai":
            done = "data: [DONE]" in text and 'data: {"error"' not in text
        else:
            done = "event: message_stop" in text and "event: error" not in text
        return [] if done else ["stream_not_finished"]
    try:
        obj = json.loads(body)
    except ValueError:
        return ["answer_not_json"]
    if api == "anthropic":
        good = isinstance(obj, dict) and obj.get("type") == "message" and isinstance(obj.get("content"), list)
    else:
        good = isinstance(obj, dict) and isinstance(obj.get("choices"), list)
    return [] if good else ["answer_not_in_caller_shape"]
