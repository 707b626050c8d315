"""Request validators for both APIs: what an upstream would reject.

:func:`violations` returns a ``Counter`` of ``(kind, key)`` pairs, position-free on purpose so
the pipeline can compare a pass's output with its input (``after - before``): a pass is
reverted only for violations it *introduced* (input that was already invalid is forwarded as the
client sent it — the upstream's error is the client's to see).

Kinds (source of each rule):

* ``unanswered_tool_use`` / ``orphan_tool_result`` — OpenAI: every ``tool_calls`` id needs a
  ``role: "tool"`` message right after the assistant message, and a tool message must answer a
  preceding call; Anthropic: ``tool_use`` ids need ``tool_result`` blocks in the next user
  message ("tool_use ids were found without tool_result blocks immediately after", case B16).
* ``tool_result_not_first`` — Anthropic: tool_result blocks come first in that user message.
* ``empty_message`` / ``empty_text_block`` — empty content (Anthropic rejects empty text blocks,
  case B18).
* ``undefined_tool`` / ``tool_choice_undefined`` — a tool used in the history or named anywhere
  in ``tool_choice`` (:func:`tool_choice_names`, ``allowed_tools`` included) is not defined
  (case B06, issue 8 class 3).
* ``too_many_breakpoints`` / ``ttl_order`` — at most 4 ``cache_control`` breakpoints counted in
  every place the API allows one (:func:`cache_markers`: tools, system blocks, message blocks,
  blocks nested in ``tool_result`` / ``search_result`` / ``document``, plus a top-level one), and
  ``ttl: "1h"`` entries must come before ``5m`` ones (Anthropic prompt-caching docs, see
  ``prefixgate/config/cache_rules.py``). Checked for both APIs: an OpenAI-shaped body bridged to Anthropic
  carries its content parts' markers along.
* ``bad_role`` — Anthropic messages are ``user``, ``assistant`` or ``system`` (a mid-conversation
  system message, https://platform.claude.com/docs/en/build-with-claude/mid-conversation-system-messages,
  kept in place: :mod:`prefixgate.rewriter.wire.forms`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prefixgate.rewriter.wire.ir import Message, Prompt, iter_blocks

Violations = Counter[tuple[str, str]]

MAX_BREAKPOINTS = 4


def _openai_pairing(msgs: tuple[Message, ...], out: Violations) -> None:
    pending: Counter[str] = Counter()  # a multiset: linear in calls (a list was quadratic)
    in_tool_run = False
    for m in msgs:
        if m.role == "tool":
            tid = m.tool_call_id or ""
            if in_tool_run and pending[tid] > 0:
                pending[tid] -= 1
            else:
                out[("orphan_tool_result", tid)] += 1
            continue
        for tid in pending.elements():
            out[("unanswered_tool_use", tid)] += 1
        calls = [b.tool_id or "" for b in m.blocks if b.type == "tool_use"]
        pending = Counter(calls) if m.role == "assistant" else Counter()
        in_tool_run = m.role == "assistant" and bool(calls)
    for tid in pending.elements():
        out[("unanswered_tool_use", tid)] += 1


def _anthropic_pairing(msgs: tuple[Message, ...], out: Violations) -> None:
    prev_calls: list[str] = []
    for m in msgs:
        if m.role not in ("user", "assistant", "system"):
            out[("bad_role", m.role)] += 1
        results = [b.tool_id or "" for b in m.blocks if b.type == "tool_result"]
        if m.role == "user":
            calls_set, results_set = set(prev_calls), set(results)  # linear membership tests
            for tid in results:
                if tid not in calls_set:
                    out[("orphan_tool_result", tid)] += 1
            for tid in prev_calls:
                if tid not in results_set:
                    out[("unanswered_tool_use", tid)] += 1
            seen_other = False
            for b in m.blocks:
                if b.type != "tool_result":
                    seen_other = True
                elif seen_other:
                    out[("tool_result_not_first", b.tool_id or "")] += 1
        elif prev_calls:
            for tid in prev_calls:
                out[("unanswered_tool_use", tid)] += 1
        prev_calls = ([b.tool_id or "" for b in m.blocks if b.type == "tool_use"]
                      if m.role == "assistant" else [])


def _empties(prompt: Prompt, out: Violations) -> None:
    for m in (*prompt.system, *prompt.messages):
        has_calls = any(b.type == "tool_use" for b in m.blocks) or "function_call" in m.raw
        if m.role not in ("tool", "function") and not has_calls and (
                not m.blocks or (m.form == "string" and m.text == "")):
            out[("empty_message", m.role)] += 1
        if prompt.api == "anthropic" and m.form == "list":
            for b in m.blocks:
                if b.type == "text" and b.raw.get("text") == "":
                    out[("empty_text_block", m.role)] += 1


_MAX_NAME_DEPTH = 16


def _names_in(value: object, depth: int = 0) -> Iterator[str]:
    if depth > _MAX_NAME_DEPTH:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "name" and isinstance(v, str):
                yield v
            else:
                yield from _names_in(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _names_in(v, depth + 1)


def tool_choice_names(prompt: Prompt) -> set[str]:
    """Every tool name in ``tool_choice`` / legacy ``function_call``, whatever the form: a
    string under a ``name`` key at any depth — ``{"type":"function","function":{"name"}}``,
    Anthropic ``{"type":"tool","name"}``, Chat Completions ``{"type":"allowed_tools",
    "allowed_tools":{"mode","tools":[{"type":"function","function":{"name"}}]}}``, Responses
    ``{"type":"allowed_tools","tools":[{"type":"function","name"}]}`` (OpenAI function-calling
    guide, "allowed tools", read 2026-12-01). String choices (``"auto"``) name no tool."""
    names: set[str] = set()
    for key in ("tool_choice", "function_call"):
        names.update(_names_in(prompt.params.get(key)))
    return names


def _tool_definitions(prompt: Prompt, out: Violations) -> None:
    defined = {t.name for t in prompt.tools or ()}
    for m in prompt.messages:
        for b in m.blocks:
            if b.type == "tool_use" and (b.tool_name or "") not in defined:
                out[("undefined_tool", b.tool_name or "")] += 1
    if prompt.tools is None and "functions" in prompt.params:
        return  # legacy function_call names a ``functions`` entry, not a tool
    for choice in sorted(tool_choice_names(prompt)):
        if choice not in defined:
            out[("tool_choice_undefined", choice)] += 1


_MAX_NEST = 16


def _nested_markers(raw: dict[str, Any], depth: int = 0) -> Iterator[dict[str, Any]]:
    """``cache_control`` dicts of the blocks nested in a block, in document order: a
    ``tool_result`` / ``search_result`` ``content`` list, a content-source ``document``'s
    ``source.content`` list, recursively. A ``tool_use`` ``input`` is data, never looked into."""
    if depth > _MAX_NEST:
        return
    lists = [raw.get("content")]
    source = raw.get("source")
    if isinstance(source, dict):
        lists.append(source.get("content"))
    for items in lists:
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict):
                continue
            yield from _nested_markers(item, depth + 1)
            cc = item.get("cache_control")
            if isinstance(cc, dict):
                yield cc


def cache_markers(prompt: Prompt) -> list[tuple[int, bool, str]]:
    """Every ``cache_control`` breakpoint of a request in prefix order, as ``(unit, nested,
    ttl)``: ``unit`` indexes :func:`prefixgate.rewriter.wire.ir.iter_blocks` (tools, system blocks, message
    blocks); ``nested`` is True for a marker on a block inside that unit (a ``tool_result``'s
    content, a ``search_result``'s content, a content-source ``document``), which precedes the
    unit's own marker; ``ttl`` is ``"5m"`` or ``"1h"`` as written (default ``"5m"``). A
    top-level ``cache_control`` (automatic caching) is not included: see
    :func:`breakpoint_count`. Anthropic prompt-caching docs (read 2026-12-01): markers may sit on
    tools, system blocks, message content blocks and blocks nested in ``tool_result``; all count
    toward the limit of 4.
    """
    out: list[tuple[int, bool, str]] = []
    for i, (_, _, _, node) in enumerate(iter_blocks(prompt)):
        out.extend((i, True, str(cc.get("ttl", "5m"))) for cc in _nested_markers(node.raw))
        own = node.cache_control
        if own is not None:
            out.append((i, False, str(own.get("ttl", "5m"))))
    return out


def breakpoint_count(prompt: Prompt) -> int:
    """Breakpoints the upstream counts: every marker of :func:`cache_markers`, plus one for a
    top-level ``cache_control`` (automatic caching takes a slot)."""
    auto = isinstance(prompt.params.get("cache_control"), dict)
    return len(cache_markers(prompt)) + (1 if auto else 0)


def _breakpoints(prompt: Prompt, out: Violations) -> None:
    ttls = [ttl for _, _, ttl in cache_markers(prompt)]
    top = prompt.params.get("cache_control")
    if isinstance(top, dict):
        ttls.append(str(top.get("ttl", "5m")))
    if len(ttls) > MAX_BREAKPOINTS:
        out[("too_many_breakpoints", str(len(ttls)))] += 1
    seen_5m = False
    for t in ttls:
        if t == "5m":
            seen_5m = True
        elif t == "1h" and seen_5m:
            out[("ttl_order", "1h after 5m")] += 1


def violations(prompt: Prompt) -> Violations:
    """Every rule the prompt breaks, as a Counter of ``(kind, key)`` (empty when valid)."""
    out: Violations = Counter()
    if prompt.api == "openai":
        _openai_pairing(prompt.messages, out)
    else:
        _anthropic_pairing(prompt.messages, out)
    _breakpoints(prompt, out)
    _empties(prompt, out)
    _tool_definitions(prompt, out)
    return out


def introduced(before: Prompt, after: Prompt) -> list[str]:
    """Violations present in ``after`` but not in ``before``, as sorted ``"kind:key"`` strings."""
    return new_violations(violations(before), violations(after))


def new_violations(before: Violations, after: Violations) -> list[str]:
    """:func:`introduced` from already computed :func:`violations` of the input and the output
    (the pipeline carries a pass's output's violations to the next pass as its input's)."""
    return sorted(f"{k}:{v}" for (k, v) in (after - before).elements())
