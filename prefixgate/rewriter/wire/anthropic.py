"""Anthropic Messages body <-> :class:`prefixgate.rewriter.wire.ir.Prompt`.

Modelled keys: ``tools`` (list of objects), ``system`` (string or list of block objects, as one
``Message(role="system")``) and ``messages`` (list of objects with string / block-list
``content``). ``cache_control`` markers live in the block / tool dicts and stay exactly where the
client put them. Everything else (``model``, ``max_tokens``, ``thinking``, top-level
``cache_control``, unknown keys) is kept verbatim. ``render(parse(b))`` is key-order identical.
A block-list ``system`` is never collapsed into a string (case B02).
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
from prefixgate.rewriter.wire.ir import Message, Prompt, Tool


def _parse_message(m: dict[str, Any]) -> Message:
    blocks, form = parse_content(m.get("content"), "content" in m)
    role = m.get("role")
    return Message(role if isinstance(role, str) else "", blocks, form, m)


def parse(body: dict[str, Any]) -> Prompt:
    """Parse a Messages request body (never raises on odd shapes: they stay params)."""
    modelled: set[str] = set()
    tools: tuple[Tool, ...] | None = None
    if is_list_of_dicts(body.get("tools")):
        tools = tuple(Tool(t) for t in body["tools"])
        modelled.add("tools")
    system: tuple[Message, ...] = ()
    system_present = False
    if "system" in body:
        try:
            blocks, form = parse_content(body["system"], True)
            if form in ("string", "list"):
                system = (Message("system", blocks, form, {}),)
                modelled.add("system")
                system_present = True
        except UnmodelledShape:
            pass
    messages: tuple[Message, ...] = ()
    if is_list_of_dicts(body.get("messages")):
        try:
            messages = tuple(_parse_message(m) for m in body["messages"])
            modelled.add("messages")
        except UnmodelledShape:
            messages = ()
    params = {k: v for k, v in body.items() if k not in modelled}
    return Prompt("anthropic", tools, system, messages, params, tuple(body),
                  system_present=system_present)


def render_message(msg: Message) -> dict[str, Any]:
    """Wire dict of one message: ``raw`` with ``content`` re-rendered in place."""
    return render_message_dict(msg, {"content": render_content(list(msg.blocks), msg.form)})


def render(prompt: Prompt) -> dict[str, Any]:
    """Wire body of a prompt (inverse of :func:`parse`)."""

    def tools() -> tuple[bool, Any]:
        return prompt.tools is not None, [t.raw for t in prompt.tools or ()]

    def system() -> tuple[bool, Any]:
        if not prompt.system:
            return False, None
        return render_content(list(prompt.system[0].blocks), prompt.system[0].form)

    def messages() -> tuple[bool, Any]:
        return True, [render_message(m) for m in prompt.messages]

    modelled = {}
    if prompt.tools is not None or "tools" not in prompt.params:
        modelled["tools"] = tools
    if prompt.system or "system" not in prompt.params:
        modelled["system"] = system
    if prompt.messages or ("messages" in prompt.key_order and "messages" not in prompt.params):
        modelled["messages"] = messages
    return render_body(prompt, modelled)
