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
* ``undefined_tool`` / ``tool_choice_undefined`` — a tool used in the history or named by
  ``tool_choice`` is not defined (case B06).
* ``too_many_breakpoints`` / ``ttl_order`` — Anthropic: at most 4 ``cache_control`` blocks, and
  ``ttl: "1h"`` entries must come before ``5m`` ones (Anthropic prompt-caching docs, see
  ``config/cache_rules.py``).
* ``bad_role`` — Anthropic messages are ``user`` or ``assistant`` only.
"""

from __future__ import annotations

from collections import Counter

from rewriter.ir import Message, Prompt, iter_blocks, tool_choice_name

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
        if m.role not in ("user", "assistant"):
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
        has_calls = any(b.type == "tool_use" for b in m.blocks)
        if m.role != "tool" and not has_calls and (
                not m.blocks or (m.form == "string" and m.text == "")):
            out[("empty_message", m.role)] += 1
        if prompt.api == "anthropic" and m.form == "list":
            for b in m.blocks:
                if b.type == "text" and b.raw.get("text") == "":
                    out[("empty_text_block", m.role)] += 1


def _tool_definitions(prompt: Prompt, out: Violations) -> None:
    defined = {t.name for t in prompt.tools or ()}
    for m in prompt.messages:
        for b in m.blocks:
            if b.type == "tool_use" and (b.tool_name or "") not in defined:
                out[("undefined_tool", b.tool_name or "")] += 1
    choice = tool_choice_name(prompt)
    if choice is not None and choice not in defined:
        out[("tool_choice_undefined", choice)] += 1


def _breakpoints(prompt: Prompt, out: Violations) -> None:
    ttls: list[str] = []
    for _, _, _, node in iter_blocks(prompt):
        cc = node.cache_control
        if cc is not None:
            ttls.append(str(cc.get("ttl", "5m")))
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
    new = violations(after) - violations(before)
    return sorted(f"{k}:{v}" for (k, v) in new.elements())
