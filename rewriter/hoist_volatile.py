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

Which spans: the stateless detectors of :mod:`rewriter.volatile_spans` (clock readings, ids),
plus **learned** volatility (``settings.learn_volatility``): the system text is split into lines
and the session memory keeps, per line, a 16-hex sha256 of its post-hoist text (no prompt text
is stored). A line that differs from the previous request's line at the same place
(``difflib`` replace opcode over the hash lists) is volatile from then on: it is remembered as
``(hash of the stable line before it, offset)`` and hoisted whole on every later request of the
session. Lines longer than :data:`MAX_LEARNED_LINE_CHARS` are reported, not moved. Changed tool
definitions are reported (``region="tools"``), never edited.

Memory (``Edit.memory["hoist_volatile"]``): ``{"lines": [hash, ...], "learned": [[anchor, off],
...], "tools": {name: hash}}``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from rewriter.ir import Block, Message, Prompt
from rewriter.types import Context, Edit
from rewriter.volatile_spans import Span, find_spans

NAME = "hoist_volatile"
MEMORY_KEY = "hoist_volatile"
MAX_LEARNED_LINE_CHARS = 600
MAX_LEARNED = 32
MAX_CHANGED_LINES = 4
NOTE_HEADER = "(Current values for the placeholders in the instructions above:)"
NOTE_CONTEXT_CHARS = 300


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class _Line:
    block: int  # index into the flat list of system text blocks
    start: int
    end: int  # without the newline


def _system_texts(prompt: Prompt) -> list[tuple[int, int, str]]:
    """``(message index, block index, text)`` of every system text block."""
    return [(mi, bi, b.text) for mi, m in enumerate(prompt.system)
            for bi, b in enumerate(m.blocks) if b.is_text]


def _lines(texts: list[str]) -> list[_Line]:
    out: list[_Line] = []
    for bi, t in enumerate(texts):
        pos = 0
        for part in t.split("\n"):
            out.append(_Line(bi, pos, pos + len(part)))
            pos += len(part) + 1
    return out


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
        for sp in sps:
            ls = t.rfind("\n", 0, sp.start) + 1
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


def _learned_spans(texts: list[str], learned: list[list[Any]],
                   taken: dict[int, list[Span]]) -> tuple[dict[int, list[Span]], list[str]]:
    """Whole-line spans for learned entries, skipping lines that already hold a span."""
    lines = _lines(texts)
    hashes = [_h(texts[ln.block][ln.start:ln.end]) for ln in lines]
    out: dict[int, list[Span]] = {}
    skipped: list[str] = []
    for anchor, off in learned:
        base = -1 if anchor == "^" else (hashes.index(anchor) if anchor in hashes else None)
        if base is None:
            continue
        j = base + int(off)
        if not 0 <= j < len(lines):
            continue
        ln = lines[j]
        text = texts[ln.block][ln.start:ln.end]
        lead = len(text) - len(text.lstrip())
        s, e = ln.start + lead, ln.start + len(text.rstrip())
        if e <= s or any(sp.start < e and s < sp.end for sp in
                         taken.get(ln.block, []) + out.get(ln.block, [])):
            continue
        if e - s > MAX_LEARNED_LINE_CHARS:
            skipped.append(f"system line {j} ({e - s} chars)")
            continue
        out.setdefault(ln.block, []).append(Span("learned", s, e))
    return out, skipped


def _learn(prev: list[str], cur: list[str]) -> list[list[Any]]:
    """New learned entries from the lines that changed in place since the previous request."""
    entries: list[list[Any]] = []
    sm = difflib.SequenceMatcher(None, prev, cur, autojunk=False)
    counts: dict[str, int] = {}
    for h in cur:
        counts[h] = counts.get(h, 0) + 1
    for op, _i1, _i2, j1, j2 in sm.get_opcodes():
        if op != "replace":
            continue
        base = j1 - 1
        while base >= 0 and counts[cur[base]] != 1:  # anchor on a line that is unique
            base -= 1
        anchor = "^" if base < 0 else cur[base]
        entries.extend([anchor, j - base] for j in range(j1, j2))
    return entries


def _tool_hashes(prompt: Prompt) -> dict[str, str]:
    return {t.name: _h(json.dumps(t.raw, sort_keys=True)) for t in prompt.tools or ()}


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


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Hoist volatile system spans to the end; Edits for the system move and tool changes."""
    mem_in = ctx.session.get(MEMORY_KEY) or {}
    prev_lines = [x for x in mem_in.get("lines", []) if isinstance(x, str)]
    learned: list[list[Any]] = [list(e) for e in mem_in.get("learned", [])
                                if isinstance(e, (list, tuple)) and len(e) == 2]
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
        extra, skipped = _learned_spans(texts, learned, spans)
        for bi, sps in extra.items():
            spans.setdefault(bi, []).extend(sps)
        if prev_lines:
            trial, _ = _apply(texts, spans)
            cur = [_h(trial[ln.block][ln.start:ln.end]) for ln in _lines(trial)]
            new_entries = [e for e in _learn(prev_lines, cur) if e not in learned]
            if len(new_entries) > max(MAX_CHANGED_LINES, len(cur) // 4):
                edits.append(Edit(NAME, False, "system", f"system prompt changed in "
                                  f"{len(new_entries)} lines: treated as a new prompt, not "
                                  "learned as volatile"))
                new_entries = []
            if new_entries:
                learned = (learned + new_entries)[-MAX_LEARNED:]
                extra, more = _learned_spans(texts, new_entries, spans)
                skipped += more
                for bi, sps in extra.items():
                    spans.setdefault(bi, []).extend(sps)
    new_texts, notes = _apply(texts, spans)
    final_lines = [_h(new_texts[ln.block][ln.start:ln.end]) for ln in _lines(new_texts)]
    memory = {MEMORY_KEY: {"lines": final_lines, "learned": [list(e) for e in learned],
                           "tools": tools_now}}
    if skipped:
        edits.append(Edit(NAME, False, "system", "volatile lines too long to move: "
                          + ",".join(skipped[:5])))
    if not notes:
        edits.append(Edit(NAME, False, "system", "no volatile span in the system region",
                          memory=memory))
        return prompt, edits
    note = NOTE_HEADER + "\n" + "\n".join(f"[{i}] {n}" for i, n in enumerate(notes, 1))
    placed = add_note(_with_system(prompt, new_texts), note, ctx.settings.hoist_target)
    kinds = sorted({f"{sp.kind}@system.block{bi}" for bi, sps in spans.items() for sp in sps})
    if placed is None:
        edits.append(Edit(NAME, False, "system", "volatile spans found but no user turn to "
                          "carry them: " + ",".join(kinds), memory=memory))
        return prompt, edits
    out, where = placed
    before = after = ctx.count_tokens(note)  # a move: nothing removed
    edits.append(Edit(NAME, True, "system", f"moved {sum(map(len, spans.values()))} volatile "
                      f"span(s) [{','.join(kinds)}] to {where}", before, after, memory=memory))
    return out, edits
