"""Pass: keep a long conversation under a token budget without breaking the cache every turn.

Rule. A sliding window (drop the oldest turn whenever the prompt is too long) changes the start
of the history on every turn, so a prefix cache never hits past the system prompt. Instead this
pass uses two watermarks over the *history* tokens (``messages``; system and tools excluded —
other passes own those): when the history passes ``settings.history_high_watermark_tokens`` it
is compacted in one step down to ``settings.history_low_watermark_tokens``, and the compaction
(a *plan*) is remembered in session memory. Later turns apply the SAME plan — the same dropped
prefix, the same elided results, byte-identical — so they are append-only again and hit the
cache, until the high watermark is passed again.

Compaction, cheapest information first:

1. elide old tool results, oldest first: the content becomes a one-line note naming the tool and
   the size removed (the results of the newest tool-call round are never elided);
2. drop the oldest whole *turns* after the first one. A turn starts at a user message that is
   not a tool-result carrier; an assistant tool-call message and all of its results are inside
   one turn, so they are kept or dropped together (cases B15, B16). The *first user turn* (the
   task, and everything before it) is never dropped (issue 8 class 3: compaction dropped the
   task); the dropped turns are the ones right after it, so the history stays first turn ->
   newer turns. The newest turn is never dropped; the system prompt is not in ``messages``.

Tokens are counted with :func:`prefixgate.rewriter.analysis.tokens.json_tokens`: images, audio and
files at their fixed documented cost, never as base64 text (a short chat with one photo is not
"long").

Under the high watermark with no remembered plan the prompt passes through unchanged (byte-
identical forwarding, B16 under budget). The output is validated (:mod:`prefixgate.rewriter.wire.validate`);
if compaction would introduce a violation the input is returned with an Edit saying why
(fail-open, B15). Memory (``Edit.memory["prune_history"]``): ``{"keep": k, "drop": n, "head":
sha16 of the first k + n messages, "elide": [tool call ids], "compactions": c}`` — hashes and ids,
no text. A plan remembered in the older form (no ``keep``) is discarded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import pairwise
from typing import Any

from prefixgate.rewriter.analysis.tokens import json_tokens
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Block, Message, Prompt, with_key
from prefixgate.rewriter.wire.validate import introduced

NAME = "prune_history"
MEMORY_KEY = "prune_history"
MIN_ELIDE_TOKENS = 48


@dataclass(frozen=True)
class Plan:
    """A compaction: keep the first ``keep`` messages (the first user turn), drop the ``drop``
    messages after them (``head`` hashes the first ``keep + drop``), and elide the results of the
    tool calls in ``elide``. ``compactions``: how many times the session compacted."""

    keep: int = 0
    drop: int = 0
    head: str = ""
    elide: tuple[str, ...] = ()
    compactions: int = 0

    @property
    def empty(self) -> bool:
        """True for the no-op plan."""
        return self.drop == 0 and not self.elide

    def memory(self) -> dict[str, Any]:
        """JSON form for session memory."""
        return {"keep": self.keep, "drop": self.drop, "head": self.head, "elide": list(self.elide),
                "compactions": self.compactions}


def _msg_json(m: Message) -> str:
    return json.dumps([m.role, [b.raw for b in m.blocks], m.tool_call_id], ensure_ascii=False,
                      sort_keys=True)


def head_hash(messages: Sequence[Message]) -> str:
    """16-hex sha256 of a run of messages (roles, blocks, tool_call_id)."""
    h = hashlib.sha256()
    for m in messages:
        h.update(_msg_json(m).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def stored_plan(messages: Sequence[Message], ctx: Context) -> Plan:
    """The session's remembered plan if it still applies to ``messages`` (same dropped prefix),
    else the empty plan."""
    raw = ctx.session.get(MEMORY_KEY)
    if not isinstance(raw, dict) or "keep" not in raw:
        return Plan()
    try:
        plan = Plan(int(raw["keep"]), int(raw.get("drop", 0)), str(raw.get("head", "")),
                    tuple(str(x) for x in raw.get("elide", [])), int(raw.get("compactions", 0)))
    except (TypeError, ValueError):
        return Plan()
    end = plan.keep + plan.drop
    if min(plan.keep, plan.drop) < 0 or end > len(messages) \
            or head_hash(messages[:end]) != plan.head:
        return Plan(compactions=plan.compactions)
    return plan


def _is_turn_start(m: Message) -> bool:
    if m.role != "user" or not m.blocks or all(b.volatile for b in m.blocks):
        return False
    return m.blocks[0].type != "tool_result"


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indices where turns start (always includes 0 for a non-empty history)."""
    starts = [i for i, m in enumerate(messages) if i == 0 or _is_turn_start(m)]
    return starts


def protected_head(messages: Sequence[Message]) -> int:
    """Length of the prefix that compaction never drops: everything up to the end of the first
    user turn (the first user message with text of its own, and the answers and tool rounds up
    to the next turn start). ``len(messages)`` when the history has no second turn."""
    first = next((i for i, m in enumerate(messages) if _is_turn_start(m)), None)
    if first is None:
        return len(messages)
    return next((s for s in turn_starts(messages) if s > first), len(messages))


def _call_names(messages: Sequence[Message]) -> dict[str, str]:
    return {b.tool_id or "": b.tool_name or "tool" for m in messages for b in m.blocks
            if b.type == "tool_use"}


def elision_note(tool: str, tokens: int) -> str:
    """The text that replaces an elided tool result."""
    return f"[prefixgate: the earlier result of {tool} was elided to save context ({tokens} tokens)]"


def _elide(messages: Sequence[Message], ids: set[str], ctx: Context,
           names: dict[str, str] | None = None) -> list[Message]:
    if not ids:
        return list(messages)
    names = _call_names(messages) if names is None else names
    out: list[Message] = []
    for m in messages:
        if m.role == "tool" and (m.tool_call_id or "") in ids:
            tid = m.tool_call_id or ""
            n = ctx.count_tokens("".join(b.text for b in m.blocks))
            out.append(m.with_blocks([Block.text_block(elision_note(names.get(tid, "tool"), n))]))
            continue
        if m.role == "user" and any(b.type == "tool_result" and (b.tool_id or "") in ids
                                    for b in m.blocks):
            blocks = []
            for b in m.blocks:
                if b.type == "tool_result" and (b.tool_id or "") in ids:
                    n = ctx.count_tokens(json.dumps(b.raw.get("content"), ensure_ascii=False))
                    note = elision_note(names.get(b.tool_id or "", "tool"), n)
                    b = replace(b, raw=with_key(b.raw, "content", note))
                blocks.append(b)
            out.append(m.with_blocks(blocks))
            continue
        out.append(m)
    return out


def apply_plan(messages: Sequence[Message], plan: Plan, ctx: Context) -> list[Message]:
    """Messages after dropping ``plan.drop`` messages after the first ``plan.keep`` and eliding
    ``plan.elide`` (pure)."""
    kept = [*messages[: plan.keep], *messages[plan.keep + plan.drop:]]
    return _elide(kept, set(plan.elide), ctx)


def message_tokens(m: Message, ctx: Context) -> int:
    """Tokens of one message: text via ``ctx.count_tokens``, media at a fixed cost
    (:func:`prefixgate.rewriter.analysis.tokens.json_tokens`); memoised on the message's JSON."""
    return _count(_msg_json(m), ctx.count_tokens)


@lru_cache(maxsize=16384)
def _count(text: str, count: Callable[[str], int]) -> int:
    role, blocks, call_id = json.loads(text)
    return json_tokens([role, blocks, call_id], count)


def _tokens(messages: Sequence[Message], ctx: Context) -> list[int]:
    return [message_tokens(m, ctx) for m in messages]


def will_compact(prompt: Prompt, ctx: Context) -> bool:
    """True when :func:`run` compacts this request (history over the high watermark after the
    remembered plan is applied). Used by ``prune_tools`` to reset its sticky set."""
    msgs = apply_plan(prompt.messages, stored_plan(prompt.messages, ctx), ctx)
    return sum(_tokens(msgs, ctx)) > ctx.settings.history_high_watermark_tokens


def _elidable(messages: Sequence[Message]) -> list[tuple[int, str]]:
    """``(message index, call id)`` of tool results that may be elided, oldest first: all but the
    results of the newest assistant tool-call message when it is in the newest turn."""
    last_calls: set[str] = set()
    newest_turn = turn_starts(messages)[-1] if messages else 0
    for m in reversed(messages[newest_turn:]):
        if m.role == "assistant" and any(b.type == "tool_use" for b in m.blocks):
            last_calls = {b.tool_id or "" for b in m.blocks if b.type == "tool_use"}
            break
    out = []
    for i, m in enumerate(messages):
        if m.role == "tool" and (m.tool_call_id or "") not in last_calls:
            out.append((i, m.tool_call_id or ""))
        elif m.role == "user":
            out.extend((i, b.tool_id or "") for b in m.blocks
                       if b.type == "tool_result" and (b.tool_id or "") not in last_calls)
    return out


def compact(messages: Sequence[Message], plan: Plan, ctx: Context) -> Plan:
    """A new plan, extending ``plan``, that brings the history to the low watermark when it can:
    elide old tool results oldest first, then drop the oldest whole turns (module docstring)."""
    low = ctx.settings.history_low_watermark_tokens
    elide = set(plan.elide)
    cur = apply_plan(messages, plan, ctx)
    toks = _tokens(cur, ctx)
    total = sum(toks)
    names = _call_names(cur)
    for i, tid in _elidable(cur):
        if total <= low:
            break
        if not tid or tid in elide:
            continue
        before = toks[i]
        trial = _elide([cur[i]], elide | {tid}, ctx, names)[0]
        after = message_tokens(trial, ctx)
        if before - after < MIN_ELIDE_TOKENS:
            continue
        elide.add(tid)
        cur[i] = trial
        total += after - before
        toks[i] = after
    keep = plan.keep if plan.drop else protected_head(messages)
    drop = 0
    starts = [s for s in turn_starts(cur) if s >= keep]
    if starts and starts[0] == keep:
        for s, e in pairwise(starts):
            if total <= low:
                break
            if any(m.role in ("system", "developer") for m in cur[s:e]):
                break
            total -= sum(toks[s:e])
            drop = e - keep
    new_drop = plan.drop + drop
    rest = [*messages[:keep], *messages[keep + new_drop:]]
    kept_ids = {b.tool_id or "" for m in rest for b in m.blocks
                if b.type == "tool_result"} | {m.tool_call_id or "" for m in rest}
    return Plan(keep, new_drop, head_hash(messages[:keep + new_drop]),
                tuple(sorted(elide & kept_ids)), plan.compactions + 1)


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Apply the remembered plan, compact when over the high watermark; one Edit."""
    high = ctx.settings.history_high_watermark_tokens
    msgs = prompt.messages
    plan = stored_plan(msgs, ctx)
    before = sum(_tokens(msgs, ctx))
    cur = apply_plan(msgs, plan, ctx)
    after = sum(_tokens(cur, ctx))
    how = "reused the remembered compaction"
    if after > high:
        plan = compact(msgs, plan, ctx)
        cur = apply_plan(msgs, plan, ctx)
        after = sum(_tokens(cur, ctx))
        how = f"compaction #{plan.compactions}"
        if plan.empty:
            return prompt, [Edit(NAME, False, "messages", (
                f"history {before} tokens, over the {high}-token high watermark, but nothing "
                "may go: the first user turn, the newest turn and the newest tool results are "
                "kept"))]
    elif plan.empty:
        return prompt, [Edit(NAME, False, "messages",
                             f"history {before} tokens, under the {high}-token high watermark")]
    out = replace(prompt, messages=tuple(cur))
    bad = introduced(prompt, out)
    if msgs and cur and _is_turn_start(msgs[0]) and not _is_turn_start(cur[0]):
        bad.append("first_message_not_user_turn")
    if bad:
        return prompt, [Edit(NAME, False, "messages",
                             "compaction would be invalid, input kept: " + ",".join(bad[:5]))]
    elided_only = sum(_tokens(_elide(msgs, set(plan.elide), ctx), ctx))
    detail = (f"{how}: elided {len(plan.elide)} tool results (-{before - elided_only} tokens), "
              f"dropped {plan.drop} messages (-{elided_only - after} tokens); "
              f"history {before} -> {after} tokens")
    return out, [Edit(NAME, True, "messages", detail, before, after,
                      memory={MEMORY_KEY: plan.memory()})]
