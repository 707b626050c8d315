"""Parsing/rendering helpers shared by ``wire.openai`` and ``wire.anthropic``.

The rule that makes the IR lossless: a field is modelled only when it has the expected shape
(e.g. ``messages`` is a list of objects whose ``content`` is a string, null, absent or a list of
objects). Anything else stays in ``Prompt.params`` untouched, so odd input passes through as is
and the passes simply see less of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefixgate.rewriter.wire.ir import Block, ContentForm, Message, Prompt, with_key


class UnmodelledShape(Exception):
    """Raised internally when a field does not have the shape the IR models."""


def is_list_of_dicts(v: Any) -> bool:
    """True for a JSON array whose items are all objects."""
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


def parse_content(content: Any, present: bool) -> tuple[tuple[Block, ...], ContentForm]:
    """Blocks and form of a wire ``content`` value; raises :class:`UnmodelledShape`."""
    if not present:
        return (), "absent"
    if content is None:
        return (), "null"
    if isinstance(content, str):
        return (Block("text", {"type": "text", "text": content}, synthetic=True),), "string"
    if is_list_of_dicts(content):
        return tuple(Block(str(d.get("type", "")), d) for d in content), "list"
    raise UnmodelledShape("content")


def _plain_text(b: Block) -> bool:
    return b.type == "text" and set(b.raw) == {"type", "text"} and isinstance(b.raw["text"], str)


def render_content(blocks: list[Block], form: ContentForm) -> tuple[bool, Any]:
    """``(present, value)`` of ``content`` for blocks in a given wire form.

    A string form stays a string while every block is a plain text block (texts concatenated);
    otherwise a list of block dicts is emitted. ``null``/absent forms stay so while empty.
    """
    if form == "string" and blocks and all(_plain_text(b) for b in blocks):
        return True, "".join(str(b.raw["text"]) for b in blocks)
    if not blocks:
        if form == "null":
            return True, None
        if form == "absent":
            return False, None
        if form == "string":
            return True, ""
    return True, [b.raw for b in blocks]


def render_body(
    prompt: Prompt, modelled: dict[str, Callable[[], tuple[bool, Any]]]
) -> dict[str, Any]:
    """Top-level body: original key order, modelled keys rendered by their callbacks.

    ``modelled`` maps a key to a callback giving ``(present, value)``. Keys new to the body
    (added params, then added modelled keys) are appended in a fixed order.
    """
    out: dict[str, Any] = {}
    for k in prompt.key_order:
        if k in modelled:
            present, value = modelled[k]()
            if present:
                out[k] = value
        elif k in prompt.params:
            out[k] = prompt.params[k]
    for k, v in prompt.params.items():
        if k not in out and k not in prompt.key_order:
            out[k] = v
    for k, fn in modelled.items():
        if k not in prompt.key_order:
            present, value = fn()
            if present:
                out[k] = value
    return out


def render_message_dict(msg: Message, fields: dict[str, tuple[bool, Any]]) -> dict[str, Any]:
    """``msg.raw`` with each key of ``fields`` re-rendered in place.

    ``fields`` maps a key to ``(present, value)``: present keys keep their original position
    (appended when new), absent ones are dropped. A message built by a pass (empty ``raw``)
    gets ``role`` first.
    """
    out: dict[str, Any] = {}
    for k, v in msg.raw.items():
        if k not in fields:
            out[k] = v
        elif fields[k][0]:
            out[k] = fields[k][1]
    if not msg.raw and msg.role:
        out = {"role": msg.role, **out}
    for k, (present, value) in fields.items():
        if present and k not in out:
            out = with_key(out, k, value)
    return out
