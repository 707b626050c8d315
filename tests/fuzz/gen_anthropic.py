"""Seeded Anthropic Messages request bodies: realistic conversations plus hostile mutations.

:func:`anthropic_body` returns ``(body, valid)`` like :func:`tests.fuzz.gen_openai.openai_body`.
Valid bodies keep the API's rules: user/assistant alternation starting with a user turn,
``tool_result`` blocks first in the user turn after their ``tool_use``, no empty text block, at
most 4 ``cache_control`` markers counting every place they may sit (tools, system, message
blocks, blocks nested in ``tool_result``).
"""

from __future__ import annotations

import random
from typing import Any

from tests.fuzz import text_gen as tg
from tests.fuzz.jsontext import Num, Raw

CC = {"type": "ephemeral"}


class _Markers:
    """Hands out at most ``left`` cache_control markers (valid bodies: 4 in all)."""

    def __init__(self, r: random.Random, left: int, p: float) -> None:
        self.r, self.left, self.p = r, left, p

    def maybe(self, block: dict[str, Any]) -> dict[str, Any]:
        if self.left > 0 and self.r.random() < self.p:
            self.left -= 1
            block["cache_control"] = dict(CC) if self.r.random() < 0.8 else {"type": "ephemeral",
                                                                              "ttl": "5m"}
        return block


def _tools(r: random.Random, n: int, mk: _Markers) -> list[dict[str, Any]]:
    tools = [{"name": name, "description": tg.words(r, r.randint(2, 12)), "input_schema": tg.schema(r)}
             for name in r.sample(tg.TOOL_NAMES, n)]
    if tools:
        mk.maybe(tools[-1])
    return tools


def _document(r: random.Random, mk: _Markers) -> dict[str, Any]:
    roll = r.randrange(3)
    if roll == 0:
        src: dict[str, Any] = {"type": "text", "media_type": "text/plain", "data": tg.words(r, r.randint(5, 60))}
    elif roll == 1:
        src = {"type": "base64", "media_type": "application/pdf", "data": tg.base64ish(r, 120)}
    else:
        src = {"type": "content", "content": [{"type": "text", "text": tg.words(r, r.randint(3, 30))}]}
    doc: dict[str, Any] = {"type": "document", "source": src}
    if r.random() < 0.5:
        doc["title"] = tg.words(r, 3)
    if r.random() < 0.2:
        doc["context"] = tg.words(r, 5)
    if r.random() < 0.2:
        doc["citations"] = {"enabled": True}
    return mk.maybe(doc)


def _search_result(r: random.Random, mk: _Markers) -> dict[str, Any]:
    return mk.maybe({"type": "search_result", "source": "https://example.com/" + tg.words(r, 1),
                     "title": tg.words(r, 3),
                     "content": [{"type": "text", "text": tg.words(r, r.randint(5, 40))}]})


def _user_blocks(r: random.Random, mk: _Markers, delim: str) -> Any:
    text = tg.user_text(r, delim)
    if r.random() < 0.45:
        return text
    blocks: list[dict[str, Any]] = [mk.maybe({"type": "text", "text": text})]
    roll = r.random()
    if roll < 0.25:
        blocks.append(mk.maybe({"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": tg.base64ish(r, r.choice((40, 400, 4000)))}}))
    elif roll < 0.45:
        blocks[:0] = [_document(r, mk) for _ in range(r.randint(1, 4))]
    elif roll < 0.55:
        blocks[:0] = [_search_result(r, mk) for _ in range(r.randint(1, 3))]
    if r.random() < 0.3:
        blocks.append(mk.maybe({"type": "text", "text": tg.words(r, r.randint(1, 10))}))
    return blocks


def _tool_round(r: random.Random, names: list[str], turn: int, mk: _Markers,
                delim: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An assistant turn calling tools and the user blocks answering them (results first)."""
    uses = [{"type": "tool_use", "id": f"toolu_{turn}_{i}_{r.getrandbits(24):x}", "name": r.choice(names),
             "input": tg.tool_args(r)} for i in range(r.randint(1, 3))]
    pre: list[dict[str, Any]] = []
    if r.random() < 0.2:
        pre.append({"type": "thinking", "thinking": tg.words(r, 8), "signature": tg.base64ish(r, 24)})
    if r.random() < 0.4:
        pre.append({"type": "text", "text": tg.words(r, r.randint(1, 10))})
    results = []
    for u in uses:
        roll = r.random()
        if roll < 0.4:
            content: Any = tg.words(r, r.randint(1, 30))
        elif roll < 0.6:
            content = tg.passages(r, delim)
        else:
            content = [mk.maybe({"type": "text", "text": tg.words(r, r.randint(1, 20))})]
            if r.random() < 0.2:
                content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                            "data": tg.base64ish(r, 40)}})
        res: dict[str, Any] = {"type": "tool_result", "tool_use_id": u["id"], "content": content}
        if r.random() < 0.1:
            res["is_error"] = True
        results.append(mk.maybe(res))
    return {"role": "assistant", "content": pre + uses}, results


def _system(r: random.Random, mk: _Markers) -> Any:
    if r.random() < 0.5:
        return tg.system_text(r)
    return [mk.maybe({"type": "text", "text": tg.system_text(r)}) for _ in range(r.randint(1, 3))]


def _conversation(r: random.Random, names: list[str], mk: _Markers, delim: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    turns = r.choice((1, 1, 2, 3, 4, 6, 9, 14))
    pending: list[dict[str, Any]] = []
    for t in range(turns):
        content = _user_blocks(r, mk, delim)
        if pending:
            content = pending + ([{"type": "text", "text": content}] if isinstance(content, str) else content)
            pending = []
        msgs.append({"role": "user", "content": content})
        if t == turns - 1:
            break
        if names and r.random() < 0.45:
            call, pending = _tool_round(r, names, t, mk, delim)
            msgs.append(call)
        else:
            msgs.append({"role": "assistant", "content": tg.words(r, r.randint(1, 30)) if r.random() < 0.6
                         else [{"type": "text", "text": tg.words(r, r.randint(1, 30))}]})
    if pending:  # the last assistant turn called tools: answer them in a final user turn
        msgs.append({"role": "user", "content": pending})
    return msgs


def _params(r: random.Random, body: dict[str, Any], names: list[str]) -> None:
    if r.random() < 0.4:
        body["temperature"] = Num(r.choice(("0.70", "1", "0.0", "1.0")))
    if r.random() < 0.15:
        body["top_p"] = Num("0.90")
    if r.random() < 0.1:
        body["top_k"] = Num("40")
    if r.random() < 0.15:
        body["stop_sequences"] = ["END", tg.words(r, 1)]
    if r.random() < 0.15:
        body["metadata"] = {"user_id": "u-" + tg.words(r, 1)}
    if names and r.random() < 0.3:
        body["tool_choice"] = r.choice(({"type": "auto"}, {"type": "any"}, {"type": "none"},
                                        {"type": "tool", "name": r.choice(names)},
                                        {"type": "auto", "disable_parallel_tool_use": True}))
    if r.random() < 0.08:
        body["thinking"] = {"type": "enabled", "budget_tokens": Num("1024")}
    if r.random() < 0.25:
        body["stream"] = True
    if r.random() < 0.06:
        body["service_tier"] = "auto"
    if r.random() < 0.06:
        body["x_vendor_extension"] = tg.value(r)


def _hostile(r: random.Random, body: dict[str, Any]) -> None:
    for _ in range(r.randint(1, 2)):
        roll = r.randrange(9)
        msgs = body["messages"]
        m = r.choice(msgs)
        if roll == 0:
            body[r.choice(("temperature", "stop_sequences", "tools", "tool_choice", "system", "metadata",
                           "thinking", "top_k"))] = r.choice(("hot", Num("5"), [Num("1")], {"x": 1}, None))
        elif roll == 1:
            m["content"] = r.choice((Num("5"), {"text": "x"}, [Num("1")], [{"type": "text", "text": Num("7")}],
                                     [{"type": "mystery", "x": 1}], "", [], [{"type": "text", "text": ""}]))
        elif roll == 2:  # more than four breakpoints, one nested in a tool_result
            m["content"] = [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "r", "cache_control": dict(CC)}]}] + [
                {"type": "text", "text": tg.words(r, 2), "cache_control": dict(CC)} for _ in range(4)]
        elif roll == 3:
            msgs.insert(r.randrange(len(msgs) + 1), {"role": r.choice(("system", "tool", "assistant", "user")),
                                                     "content": tg.words(r, 3)})
        elif roll == 4:
            body["x_deep"] = Raw(tg.deep(r.choice((100, 300, 600, 1000, 1100))))
        elif roll == 5:
            m["content"] = [{"type": "tool_use", "id": "x", "name": "nope", "input": "not an object"},
                            {"type": "tool_use", "id": "y", "name": "deep", "input": {"a": Raw(tg.deep(300))}},
                            {"type": "server_tool_use", "id": "srv_1", "name": "web_search",
                             "input": {"query": "q"}},
                            {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []}]
        elif roll == 6:
            body["max_tokens"] = r.choice((Num("0"), Num("-1"), Num(str(2**70)), "10", Num("1.5")))
        elif roll == 7:
            m["content"] = tg.words(r, 2) + "".join(r.choice(tg.ODD) for _ in range(20))
        else:
            body["system"] = [{"type": "text", "text": tg.system_text(r), "cache_control": {"type": "ephemeral",
                                                                                            "ttl": "1h"}},
                              {"type": "image", "source": {"type": "url", "url": "https://e.com/i.png"}}]


def anthropic_body(r: random.Random, model: str) -> tuple[dict[str, Any], bool]:
    """One Messages body for ``model`` and whether it is valid (see module docstring)."""
    valid = r.random() >= 0.3
    mk = _Markers(r, 4, r.choice((0.0, 0.1, 0.3)))
    n_tools = r.choice((0, 0, 1, 3, 5, 8, 12))
    tools = _tools(r, n_tools, mk) if n_tools else []
    names = [t["name"] for t in tools]
    body: dict[str, Any] = {"model": model, "max_tokens": Num(str(r.choice((1, 64, 1024, 4096))))}
    if r.random() < 0.8:
        body["system"] = _system(r, mk)
    body["messages"] = _conversation(r, names, mk, "\n---\n")
    if tools:
        body["tools"] = tools
    _params(r, body, names)
    if r.random() < 0.3:
        items = list(body.items())
        r.shuffle(items)
        body = dict(items)
    if not valid:
        _hostile(r, body)
    return body, valid
