"""Pass: move volatile spans out of the stable region to the end of the prompt (case B03).

Rule. Prefix caches (Anthropic, OpenAI, radix KV reuse) match from the first token: one
changed character in the system prompt invalidates everything after it — the rest of the
system prompt, the tools (OpenAI), the whole history. So a clock reading or a request id near the
top costs a full-prompt miss on every request. This pass replaces each volatile span of the
system region with a constant placeholder (``[see note 1 at the end]``) and appends a note
carrying the original line(s) — the same information — after the stable prefix:

* ``hoist_target: "end"`` — Anthropic: a text block appended to the last message when it is a
  user turn (after any ``tool_result`` blocks, which stay first); OpenAI: a trailing
  ``{"role": "user"}`` message (so every earlier message keeps its bytes and stays cacheable).
  When the last message is an assistant prefill, the note goes to the newest user turn instead.
* ``hoist_target: "last_user"`` — appended to the newest user message (string content stays a
  string: the note is joined with a blank line).

Turns are never moved or reordered; only system text changes (placeholders) and one note is
added at the end. The note block is flagged ``volatile`` so no breakpoint lands on it.

Which spans: the stateless detectors of :mod:`prefixgate.rewriter.volatile_spans` (clock readings, ids),
plus **learned** volatility (``settings.learn_volatility``, :mod:`prefixgate.rewriter.learned_volatility`):
lines — or, in long lines, word ranges — seen changing between requests of the session, found
from hashes only (no prompt text is stored). Changed tool definitions are reported
(``region="tools"``), never edited.

Only when it pays (:mod:`prefixgate.rewriter.pays`): the pass skips, saying why in its Edit, when the
prefix it would protect is below the backend's minimum cacheable length, or when the note and
placeholders add more tokens than the move makes reusable (issue 8, class 8: a two-message chat
grew from 45 to 84 prompt tokens for nothing, and the answer changed).

Memory (``Edit.memory["hoist_volatile"]``): ``{"lines": "<8 base64 chars per tracked line>", "words":
{line: "<8 hex per word>"} (long lines only), "learned": [[anchor, offset(, p, q)], ...],
"tools": {name: 16-hex}}`` — fixed-width digests packed into single strings, the first
``MAX_TRACKED_LINES`` lines only, at most ``MAX_TRACKED_TOOLS`` tools: bounded per session.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prefixgate.rewriter.ir import Block, Message, Prompt
from prefixgate.rewriter.learned_volatility import (
    LINE_DIGEST_CHARS,
    MAX_CHANGED_LINES,
    MAX_LEARNED,
    WORD_HEX,
    h16,
    learn,
    learned_spans,
    line_hashes,
    packed_memory,
    unpack,
    word_hashes,
)
from prefixgate.rewriter.pays import Verdict, block_pieces, judge, tools_piece
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.volatile_spans import Span, find_spans

NAME = "hoist_volatile"
MEMORY_KEY = "hoist_volatile"
NOTE_HEADER = "(Current values for the placeholders in the instructions above:)"
NOTE_CONTEXT_CHARS = 300
MAX_TRACKED_TOOLS = 128
"""Tool definitions whose hashes are remembered (to report changes); the rest are not tracked."""


def _system_texts(prompt: Prompt) -> list[tuple[int, int, str]]:
    """``(message index, block index, text)`` of every system text block."""
    return [(mi, bi, b.text) for mi, m in enumerate(prompt.system)
            for bi, b in enumerate(m.blocks) if b.is_text]


def _placeholder(n: int) -> str:
    return f"[see note {n} at the end]"


def _apply(texts: list[str], spans: dict[int, list[Span]]) -> tuple[list[str], list[str]]:
    """Replace spans per block; returns new texts and the note entries (original lines)."""
    new_texts: list[str] = []
    notes: list[str] = []
    for bi, t in enumerate(texts):
        sps = sorted(spans.get(bi, []), key=lambda s: s.start)
        if not sps:
            new_texts.append(t)
            continue
        # group spans by line: one note entry (the original line) per line
        out, pos = [], 0
        line_no: dict[int, int] = {}
        ls = prev = 0
        for sp in sps:  # spans in order: search only since the previous span (linear)
            nl = t.rfind("\n", prev, sp.start)
            ls, prev = (nl + 1 if nl >= 0 else ls), sp.start
            if ls not in line_no:
                le = t.find("\n", ls)
                le = len(t) if le < 0 else le
                notes.append(_context(t[ls:le], sp.start - ls, sp.end - ls))
                line_no[ls] = len(notes)
            out.append(t[pos:sp.start])
            out.append(_placeholder(line_no[ls]))
            pos = sp.end
        out.append(t[pos:])
        new_texts.append("".join(out))
    return new_texts, notes


def _context(line: str, s: int, e: int) -> str:
    line_s = line.strip()
    if len(line_s) <= NOTE_CONTEXT_CHARS:
        return line_s
    a = max(0, s - NOTE_CONTEXT_CHARS // 2)
    return "…" + line[a:min(len(line), e + NOTE_CONTEXT_CHARS // 2)].strip() + "…"


def _tool_hashes(prompt: Prompt) -> dict[str, str]:
    return {t.name[:128]: h16(json.dumps(t.raw, sort_keys=True))
            for t in (prompt.tools or ())[:MAX_TRACKED_TOOLS]}


def _with_system(prompt: Prompt, texts: list[str]) -> Prompt:
    refs = _system_texts(prompt)
    system = [list(m.blocks) for m in prompt.system]
    for (mi, bi, old), new in zip(refs, texts):
        if new != old:
            system[mi][bi] = system[mi][bi].with_text(new)
    return replace(prompt, system=tuple(m.with_blocks(b) for m, b in zip(prompt.system, system)))


def _newest_user(msgs: tuple[Message, ...]) -> int | None:
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role == "user":
            return i
    return None


def add_note(prompt: Prompt, note: str, target: str) -> tuple[Prompt, str] | None:
    """Append ``note`` after the stable prefix (see module docstring); ``None`` if no place."""
    msgs = list(prompt.messages)
    if not msgs:
        return None
    last = msgs[-1]
    if target == "end" and prompt.api == "openai" and last.role in ("user", "tool"):
        msgs.append(Message("user", (Block.text_block(note, volatile=True),), "string",
                            {"role": "user", "content": note}))
        return replace(prompt, messages=tuple(msgs)), f"messages[{len(msgs) - 1}] (new user turn)"
    i = _newest_user(prompt.messages)
    if i is None:
        return None
    m = msgs[i]
    if m.form == "string" and (prompt.api == "openai" or target == "last_user") and \
            len(m.blocks) == 1 and m.blocks[0].is_text:
        b = m.blocks[0]
        joined = b.with_text(b.text + "\n\n" + note)
        msgs[i] = m.with_blocks([replace(joined, volatile=True)])
    else:
        blocks = list(m.blocks) + [Block.text_block(note, volatile=True)]
        msgs[i] = replace(m.with_blocks(blocks), form="list")
    return replace(prompt, messages=tuple(msgs)), f"messages[{i}]"


NEW_TURN_TOKENS = 4
"""Chat-template tokens of the extra user turn the note may open (role markers)."""


def _pays(prompt: Prompt, ctx: Context, texts: list[str], new_texts: list[str],
          spans: dict[int, list[Span]], note: str) -> Verdict:
    """:func:`prefixgate.rewriter.pays.judge` for this move: stable before the first span, reusable from
    it to the note; added = note + placeholders - the spans' own text."""
    bi = min(spans)
    start = min(sp.start for sp in spans[bi])
    added = ctx.count_tokens(note) + NEW_TURN_TOKENS
    for b, sps in spans.items():
        for n, sp in enumerate(sps, 1):
            added += ctx.count_tokens(_placeholder(n)) - ctx.count_tokens(texts[b][sp.start:sp.end])
    before = [*tools_piece(prompt), *new_texts[:bi], new_texts[bi][:start]]
    gained = [new_texts[bi][start:], *new_texts[bi + 1:],
              *(p for m in prompt.messages for p in block_pieces(m.blocks))]
    return judge(ctx.provider, ctx.model, before, gained, max(0, added), ctx.count_tokens)


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Hoist volatile system spans to the end; Edits for the system move and tool changes."""
    mem_in = ctx.session.get(MEMORY_KEY) or {}
    prev_lines = unpack(mem_in.get("lines"), LINE_DIGEST_CHARS)
    words_in = mem_in.get("words")
    prev_words = {k: unpack(v, WORD_HEX) for k, v in words_in.items()} \
        if isinstance(words_in, dict) else {}
    learned: list[list[Any]] = [list(e) for e in mem_in.get("learned", [])
                                if isinstance(e, (list, tuple)) and len(e) in (2, 4)]
    edits: list[Edit] = []

    prev_tools = mem_in.get("tools") or {}
    tools_now = _tool_hashes(prompt)
    changed_tools = sorted(n for n, h in tools_now.items() if n in prev_tools and prev_tools[n] != h)
    if changed_tools:
        edits.append(Edit(NAME, False, "tools", "tool definitions changed since the previous "
                          "request (not moved): " + ",".join(changed_tools[:10])))

    refs = _system_texts(prompt)
    texts = [t for _, _, t in refs]
    spans: dict[int, list[Span]] = {}
    for bi, t in enumerate(texts):
        found = find_spans(t)
        if found:
            spans[bi] = found
    skipped: list[str] = []
    if ctx.settings.learn_volatility and texts:
        extra, skipped = learned_spans(texts, learned, spans)
        for bi, sps in extra.items():
            spans.setdefault(bi, []).extend(sps)
        if prev_lines:
            trial, _ = _apply(texts, spans)
            cur = line_hashes(trial)
            new_entries = [e for e in learn(prev_lines, cur, prev_words, word_hashes(trial))
                           if e not in learned]
            if len(new_entries) > max(MAX_CHANGED_LINES, len(cur) // 4):
                edits.append(Edit(NAME, False, "system", f"system prompt changed in "
                                  f"{len(new_entries)} lines: treated as a new prompt, not "
                                  "learned as volatile"))
                new_entries = []
            if new_entries:
                learned = (learned + new_entries)[-MAX_LEARNED:]
                extra, more = learned_spans(texts, new_entries, spans)
                skipped += more
                for bi, sps in extra.items():
                    spans.setdefault(bi, []).extend(sps)
    new_texts, notes = _apply(texts, spans)
    lines_packed, words_packed = packed_memory(new_texts)
    memory = {MEMORY_KEY: {"lines": lines_packed, "words": words_packed,
                           "learned": [list(e) for e in learned], "tools": tools_now}}
    if skipped:
        edits.append(Edit(NAME, False, "system", "volatile lines too long to move: "
                          + ",".join(skipped[:5])))
    if not notes:
        edits.append(Edit(NAME, False, "system", "no volatile span in the system region",
                          memory=memory))
        return prompt, edits
    note = NOTE_HEADER + "\n" + "\n".join(f"[{i}] {n}" for i, n in enumerate(notes, 1))
    verdict = _pays(prompt, ctx, texts, new_texts, spans, note)
    if not verdict.pays:
        edits.append(Edit(NAME, False, "system", f"skipped, does not pay: {verdict.why}",
                          memory=memory))
        return prompt, edits
    placed = add_note(_with_system(prompt, new_texts), note, ctx.settings.hoist_target)
    kinds = sorted({f"{sp.kind}@system.block{bi}" for bi, sps in spans.items() for sp in sps})
    if placed is None:
        edits.append(Edit(NAME, False, "system", "volatile spans found but no user turn to "
                          "carry them: " + ",".join(kinds), memory=memory))
        return prompt, edits
    out, where = placed
    before = after = ctx.count_tokens(note)  # a move: nothing removed
    edits.append(Edit(NAME, True, "system", f"moved {sum(map(len, spans.values()))} volatile "
                      f"span(s) [{','.join(kinds)}] to {where}", before, after, memory=memory,
                      tokens_reusable=verdict.gain, tokens_added=verdict.added))
    return out, edits
