"""Seeded Chat Completions request bodies: realistic conversations plus hostile mutations.

:func:`openai_body` returns ``(body, valid)``: ``valid`` is True when the body follows the API's
rules (tool calls answered, tools defined, content types right), so any invalid upstream body is
the proxy's doing; hostile bodies (``valid=False``) carry wrong types, unknown shapes, deep
nesting, and still must never get a 5xx.
"""

from __future__ import annotations

import random
from typing import Any

from tests.fuzz import text_gen as tg
from tests.fuzz.jsontext import Num, Raw, dumps


def _tools(r: random.Random, n: int) -> list[dict[str, Any]]:
    names = r.sample(tg.TOOL_NAMES, n)
    return [{"type": "function", "function": {"name": name, "description": tg.words(r, r.randint(2, 12)),
                                              "parameters": tg.schema(r)}} for name in names]


def _user_content(r: random.Random, delim: str) -> Any:
    text = tg.user_text(r, delim)
    if r.random() < 0.55:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if r.random() < 0.4:
        parts.append({"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + tg.base64ish(r, r.choice((40, 400, 4000))),
            **({"detail": "low"} if r.random() < 0.3 else {})}})
    if r.random() < 0.15:
        parts.append({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}})
    if r.random() < 0.3:
        parts.append({"type": "text", "text": tg.words(r, r.randint(1, 10))})
    if r.random() < 0.08:
        parts.append({"type": "input_audio", "input_audio": {"data": tg.base64ish(r, 60),
                                                             "format": "wav"}})
    if r.random() < 0.06:
        parts.append({"type": "file", "file": {"filename": "a.pdf", "file_data":
                                               "data:application/pdf;base64," + tg.base64ish(r, 80)}})
    if r.random() < 0.15:  # some OpenAI-compatible servers honour Anthropic-style markers
        parts[0]["cache_control"] = {"type": "ephemeral"}
    return parts


def _tool_round(r: random.Random, names: list[str], turn: int) -> list[dict[str, Any]]:
    calls = [{"id": f"call_{turn}_{i}_{r.getrandbits(24):x}", "type": "function",
              "function": {"name": r.choice(names), "arguments": dumps(tg.tool_args(r)).decode()}}
             for i in range(r.randint(1, 3))]
    msg: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
    if r.random() < 0.3:
        msg["content"] = tg.words(r, r.randint(1, 10))
    out = [msg]
    for c in calls:
        content: Any = tg.words(r, r.randint(1, 30))
        if r.random() < 0.25:
            content = tg.passages(r, "\n---\n")
        elif r.random() < 0.15:
            content = [{"type": "text", "text": tg.words(r, r.randint(1, 20))}]
        out.append({"role": "tool", "tool_call_id": c["id"], "content": content})
    return out


def _conversation(r: random.Random, names: list[str], delim: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for _ in range(r.choice((0, 1, 1, 1, 2))):
        msgs.append({"role": r.choice(("system", "system", "developer")), "content": tg.system_text(r)})
    turns = r.choice((1, 1, 2, 3, 4, 6, 9, 14))
    for t in range(turns):
        msgs.append({"role": "user", "content": _user_content(r, delim)})
        if names and r.random() < 0.45:
            msgs.extend(_tool_round(r, names, t))
        if t < turns - 1 or r.random() < 0.1:
            msgs.append({"role": "assistant", "content": tg.words(r, r.randint(1, 30))})
            if r.random() < 0.08:  # a system message mid-conversation
                msgs.append({"role": "system", "content": tg.system_text(r)})
    return msgs


def _params(r: random.Random, body: dict[str, Any], names: list[str]) -> None:
    if r.random() < 0.5:
        body["temperature"] = Num(r.choice(("0.70", "1", "0.0", "1.10")))
    if r.random() < 0.3:
        body[r.choice(("max_tokens", "max_completion_tokens"))] = Num(str(r.randint(1, 4096)))
    if r.random() < 0.2:
        body["top_p"] = Num("0.90")
    if r.random() < 0.15:
        body["stop"] = r.choice(("\n\n", ["END", "STOP"]))
    if r.random() < 0.15:
        body["seed"] = Num(str(r.randrange(2**31)))
    if r.random() < 0.1:
        body["n"] = Num("2")
    if r.random() < 0.1:
        body["response_format"] = {"type": "json_object"}
    if r.random() < 0.1:
        body["user"] = "user-" + tg.words(r, 1)
    if r.random() < 0.1:
        body["metadata"] = {"trace": tg.words(r, 2)}
    if r.random() < 0.1:
        body["parallel_tool_calls"] = r.random() < 0.5
    if names and r.random() < 0.3:
        body["tool_choice"] = r.choice((
            "auto", "required", "none", {"type": "function", "function": {"name": r.choice(names)}},
            {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                {"type": "function", "function": {"name": n}} for n in names[:2]]}}))
    if r.random() < 0.25:
        body["stream"] = True
        if r.random() < 0.6:
            body["stream_options"] = {"include_usage": True}
    if r.random() < 0.08:
        body["x_vendor_extension"] = tg.value(r)


HOSTILE = (
    ("temperature", "hot"), ("stop", Num("5")), ("tools", Num("5")), ("n", []),
    ("stream_options", "yes"), ("max_tokens", "10"), ("max_tokens", Num("0")),
    ("tool_choice", Num("3")), ("response_format", "json"), ("user", Num("12")),
    ("logit_bias", {"50256": Num("-100")}), ("seed", Num(str(2**70))), ("metadata", [1]),
)


def _hostile(r: random.Random, body: dict[str, Any]) -> None:
    """One or two hostile mutations (wrong types, odd shapes, deep nesting)."""
    for _ in range(r.randint(1, 2)):
        roll = r.randrange(9)
        msgs = body["messages"]
        m = r.choice(msgs)
        if roll == 0:
            k, v = r.choice(HOSTILE)
            body[k] = v
        elif roll == 1:
            m["content"] = r.choice((Num("5"), {"text": "x"}, [Num("1")], [{"type": "text", "text": Num("7")}],
                                     [{"type": "mystery", "x": 1}], "", []))
        elif roll == 2:
            msgs.insert(r.randrange(len(msgs) + 1), {"role": "assistant", "tool_calls": r.choice((
                "abc", [{"id": "c1", "function": {"name": "x", "arguments": "{not json"}}],
                [{"id": "c2", "type": "function", "function": {"name": "get_order", "arguments": "[1,2]"}}],
                [{"id": "c3", "type": "function", "function": {"name": "get_order",
                                                               "arguments": '{"a":' + tg.deep(300) + "}"}}],
                [Num("1")]))})
        elif roll == 3:
            msgs.insert(r.randrange(len(msgs) + 1), {"role": r.choice(("function", "tool", "critic", "")),
                                                     "name": "get_weather", "content": tg.words(r, 3)})
        elif roll == 4:
            body["x_deep"] = Raw(tg.deep(r.choice((100, 300, 600, 1000, 1100))))
        elif roll == 5:
            m["name"] = r.choice(("bob", Num("5"), tg.words(r, 2)))
            m[r.choice(("x_extra", "annotations", "cache_control"))] = tg.value(r)
        elif roll == 6:
            tools = body["tools"] if isinstance(body.get("tools"), list) else []
            body["tools"] = tools
            tools.append(r.choice((
                {"type": "function"}, {"type": "function", "function": {"name": Num("1")}},
                {"type": "custom", "custom": {"name": "free"}}, "tool", {"function": {"name": "x",
                                                                                 "parameters": "bad"}})))
        elif roll == 7:
            m["content"] = tg.words(r, 2) + "".join(r.choice(tg.ODD) for _ in range(20))
        else:
            body["messages"] = msgs + [{"role": "user", "content": Raw(
                '"' + "\\ud83d" + '"')}]  # a lone surrogate escape: valid JSON, not valid UTF-16
    return None


def openai_body(r: random.Random, model: str) -> tuple[dict[str, Any], bool]:
    """One Chat Completions body for ``model`` and whether it is valid (see module docstring)."""
    n_tools = r.choice((0, 0, 1, 3, 5, 8, 12))
    tools = _tools(r, n_tools) if n_tools else []
    names = [t["function"]["name"] for t in tools]
    body: dict[str, Any] = {"model": model, "messages": _conversation(r, names, "\n---\n")}
    if tools:
        body["tools"] = tools
    _params(r, body, names)
    if r.random() < 0.3:
        items = list(body.items())
        r.shuffle(items)
        body = dict(items)
    valid = r.random() >= 0.3
    if not valid:
        _hostile(r, body)
    return body, valid
