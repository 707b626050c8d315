"""Mid-conversation forms: what no pass may move, merge, prune or hoist (issue 35, item 2).

A conversation can change its instructions and its tools after it started, in place, so the
turns before the change keep their prompt cache:

* a **system message inside** ``messages`` (Anthropic ``{"role": "system"}`` after a turn,
  https://platform.claude.com/docs/en/build-with-claude/mid-conversation-system-messages; Chat
  Completions ``system`` / ``developer`` after the first non-system message);
* **tool-change blocks** (Anthropic beta ``mid-conversation-tool-changes-2026-07-01``:
  ``tool_addition`` / ``tool_removal``; tool search's ``tool_reference`` blocks, also nested in a
  ``tool_result``'s content);
* **any block type the rewriter does not know** (a future form), at the top level of a message
  or nested in a ``tool_result``.

Gateways that folded such system messages into the head broke caching for their users (Ollama
#18431, GoModel #713). :func:`forms` is the position-aware fingerprint the pipeline compares
before and after every pass (:func:`prefixgate.rewriter.pipeline.run_passes`): a pass whose
output changes it — a form dropped, edited, merged into a neighbour, or given another neighbour —
is dropped, fail-open, like one that breaks an API rule. ``cache_control`` markers are not part of
the fingerprint (a breakpoint may sit on a form's block where the API allows one).
"""

from __future__ import annotations

import json
from typing import Any

from prefixgate.rewriter.wire.ir import Message, Prompt

FORM_BLOCKS = frozenset({"tool_addition", "tool_removal", "tool_reference"})
"""Block types that change a conversation's tools in place."""
KNOWN_BLOCKS = frozenset({
    "text", "image", "document", "search_result", "tool_use", "tool_result", "thinking",
    "redacted_thinking", "input_text", "output_text", "image_url", "input_image", "input_audio",
    "file", "input_file", "refusal"})
"""Block types the passes know; any other type is kept where the client put it."""
SYSTEM_ROLES = frozenset({"system", "developer"})

Form = tuple[str, str, str, bytes]
"""``(previous message's role or "^", the form's own role, next message's role or "$", the
form's JSON without cache_control)``."""


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _dump(value: Any) -> bytes:
    return json.dumps(_clean(value), ensure_ascii=False, separators=(",", ":")).encode()


def is_form_block(raw: Any) -> bool:
    """Whether a content block (wire dict) is a tool-change or unknown block."""
    if not isinstance(raw, dict):
        return False
    kind = raw.get("type")
    return isinstance(kind, str) and (kind in FORM_BLOCKS or kind not in KNOWN_BLOCKS)


def _form_blocks(m: Message) -> list[Any]:
    out: list[Any] = []
    for b in m.blocks:
        if b.type in FORM_BLOCKS or b.type not in KNOWN_BLOCKS:  # the IR's type: an OpenAI
            out.append(b.raw)                                   # tool call is "tool_use"
        elif b.type == "tool_result" and isinstance(b.raw.get("content"), list):
            out.extend(x for x in b.raw["content"] if is_form_block(x))
    return out


def _added(m: Message) -> bool:
    return bool(m.blocks) and all(b.volatile for b in m.blocks)


def is_system_form(m: Message) -> bool:
    """A system / developer message inside the conversation (``Prompt.messages``)."""
    return m.role in SYSTEM_ROLES


def forms(prompt: Prompt) -> tuple[Form, ...]:
    """The fingerprint of every mid-conversation form of ``prompt``, in order (module doc).

    A system message inside ``messages`` counts whole; a message of another role counts by its
    tool-change / unknown blocks (nested ones in ``tool_result`` content included). Linear in
    the messages' size; only messages holding a form are serialised. A message a pass added
    (every block flagged ``volatile``: the hoisted note) is neither a form nor a neighbour."""
    msgs = [m for m in prompt.messages if not _added(m)]
    out: list[Form] = []
    for i, m in enumerate(msgs):
        if is_system_form(m):
            payload: Any = [b.raw for b in m.blocks]
        else:
            payload = _form_blocks(m)
            if not payload:
                continue
        prev = msgs[i - 1].role if i else "^"
        nxt = msgs[i + 1].role if i + 1 < len(msgs) else "$"
        out.append((prev, m.role, nxt, _dump(payload)))
    return tuple(out)


def trailing_system_start(prompt: Prompt) -> int:
    """Index into ``prompt.messages`` where the trailing run of system messages starts
    (``len(messages)`` when the last message is not one). Such a message is the turn's own
    reminder, which the next request no longer carries at that position, so a breakpoint on it
    writes a cache entry that is never read (Claude Code #96101): none is placed there."""
    i = len(prompt.messages)
    while i > 0 and is_system_form(prompt.messages[i - 1]):
        i -= 1
    return i
