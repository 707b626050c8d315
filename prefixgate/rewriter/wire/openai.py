"""OpenAI Chat Completions body <-> :class:`prefixgate.rewriter.wire.ir.Prompt`.

Modelled keys: ``tools`` (list of objects) and ``messages`` (list of objects with a modelled
``content``). Leading ``system``/``developer`` messages become ``Prompt.system``; assistant
``tool_calls`` become ``tool_use`` blocks after the content blocks. Everything else (including
``tool_choice``, ``prompt_cache_key``, unknown keys, per-message extras such as ``name`` or
SWE-agent's ``thought``) is kept verbatim. ``render(parse(b))`` is key-order identical to ``b``.
"""

from __future__ import annotations

from typing import Any

from prefixgate.rewriter.wire.common import (
    UnmodelledShape,
    is_list_of_dicts,
    parse_content,
    render_body,
    render_content,
    render_message_dict,
)
from prefixgate.rewriter.wire.ir import Block, Message, Prompt, Tool

SYSTEM_ROLES = frozenset({"system", "developer"})


def _parse_message(m: dict[str, Any]) -> Message:
    blocks, form = parse_content(m.get("content"), "content" in m)
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        if not all(isinstance(c, dict) for c in calls):
            raise UnmodelledShape("tool_calls")
        blocks = blocks + tuple(Block("tool_use", c) for c in calls)
    role = m.get("role")
    return Message(role if isinstance(role, str) else "", blocks, form, m)


def parse(body: dict[str, Any]) -> Prompt:
    """Parse a Chat Completions request body (never raises on odd shapes: they stay params)."""
    modelled: set[str] = set()
    tools: tuple[Tool, ...] | None = None
    if is_list_of_dicts(body.get("tools")):
        tools = tuple(Tool(t) for t in body["tools"])
        modelled.add("tools")
    system: list[Message] = []
    messages: list[Message] = []
    if is_list_of_dicts(body.get("messages")):
        try:
            parsed = [_parse_message(m) for m in body["messages"]]
        except UnmodelledShape:
            parsed = None
        if parsed is not None:
            modelled.add("messages")
            i = 0
            while i < len(parsed) and parsed[i].role in SYSTEM_ROLES:
                i += 1
            system, messages = parsed[:i], parsed[i:]
    params = {k: v for k, v in body.items() if k not in modelled}
    return Prompt("openai", tools, tuple(system), tuple(messages), params, tuple(body),
                  system_present="messages" in modelled)


def _tool_calls_field(msg: Message, calls: list[dict[str, Any]]) -> tuple[bool, Any]:
    if calls:
        return True, calls
    if "tool_calls" not in msg.raw:
        return False, None
    v = msg.raw["tool_calls"]
    if isinstance(v, list):
        return not v, []  # every call removed by a pass: OpenAI rejects an empty tool_calls
    return True, v


def render_message(msg: Message) -> dict[str, Any]:
    """Wire dict of one message: ``raw`` with ``content`` / ``tool_calls`` re-rendered in place."""
    content = [b for b in msg.blocks if b.type != "tool_use"]
    calls = [b.raw for b in msg.blocks if b.type == "tool_use"]
    return render_message_dict(msg, {"content": render_content(content, msg.form),
                                     "tool_calls": _tool_calls_field(msg, calls)})


def render(prompt: Prompt) -> dict[str, Any]:
    """Wire body of a prompt (inverse of :func:`parse`)."""

    def tools() -> tuple[bool, Any]:
        return prompt.tools is not None, [t.raw for t in prompt.tools or ()]

    def messages() -> tuple[bool, Any]:
        return True, [render_message(m) for m in (*prompt.system, *prompt.messages)]

    modelled = {}
    if prompt.tools is not None or "tools" not in prompt.params:
        modelled["tools"] = tools
    if prompt.system_present:
        modelled["messages"] = messages
    return render_body(prompt, modelled)
