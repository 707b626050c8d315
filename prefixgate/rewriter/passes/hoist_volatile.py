"""Pass: move volatile spans out of the stable region to after it (case B03; issue 19).

Rule. Prefix caches (Anthropic, OpenAI, radix KV reuse) match from the first token: one
changed character in the system prompt invalidates everything after it — the rest of the
system prompt, the tools (OpenAI), the whole history. So a clock reading or a request id near the
top costs a full-prompt miss on every request. This pass takes each volatile span out of the
system region and puts the same information in a note after the stable prefix
(:mod:`prefixgate.rewriter.analysis.note_placement`: where, per API, and the note's text).

What is volatile: observed, not guessed (issue 19, item 2). The detectors of
:mod:`prefixgate.rewriter.analysis.volatile_spans` (clock readings, ids) find *candidates*; a
candidate moves only when

* it was **seen changing**: its line (or, in a long line, its word range) differed from the previous
  request of the session while the lines around it stayed
  (:mod:`prefixgate.rewriter.analysis.learned_volatility`, from digests only); once seen, it keeps
  moving on every later request (sticky, so it does not flap back when a value happens to repeat); or
* the request's own text marks it **per-request**
  (:func:`prefixgate.rewriter.analysis.volatile_spans.per_request`: ``request id``, ``nonce``,
  ``trace id``, ``this request`` ... on its line).

With ``settings.learn_volatility`` a changed line that holds no candidate moves too (a live
counter, a rotating tip). A constant line — a policy's ``The current time is 2024-05-15
15:00:00 EST.`` identical on every request — therefore stays where it is, and the prompt never
holds two versions of it. The first request of a session moves only per-request spans: its
clock is first seen changing on turn 2, whose prefix differs from turn 1's at the clock either
way; from turn 3 on the prefix up to the note is reused.

How a span moves:

* a line that is about its value — at most :data:`MOVE_LINE_MAX_CHARS` long, with at most
  :data:`MOVE_LINE_MAX_CONTEXT` characters besides the moved spans (``The current time is
  <clock>.``, ``Request ID: <id>``) — moves whole: it leaves the system text with its newline
  and the note carries it as the client wrote it (one version of the fact, nothing for the
  model to resolve);
* in any other line each span becomes a placeholder ``[see note n at the end]`` and the note
  carries ``[n] <the line around it>`` (at most :data:`NOTE_CONTEXT_CHARS` around the span);
* a block whose every line would move keeps placeholders (a system block never goes empty).

Turns are never moved or reordered. Changed tool definitions are reported (``region="tools"``),
never edited.

Only when it pays (:mod:`prefixgate.rewriter.analysis.pays`): the pass skips, saying why in its Edit, when the
prefix it would protect is below the backend's minimum cacheable length, or when the note and
placeholders add more tokens than the move makes reusable (issue 8, class 8).

Memory (``Edit.memory["hoist_volatile"]``): ``{"lines": "<8 base64 chars per tracked line>", "words":
{line: "<8 hex per word>"} (long lines only), "learned": [[anchor, offset(, p, q)], ...],
"tools": {name: 16-hex}}`` — digests of the system text with every moved span replaced by its
placeholder (so line numbers stay the client's), fixed-width and packed into single strings, the
first ``MAX_TRACKED_LINES`` lines only, at most ``MAX_TRACKED_TOOLS`` tools: bounded per session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from prefixgate.rewriter.analysis.learned_volatility import (
    LINE_DIGEST_CHARS,
    MAX_CHANGED_LINES,
    MAX_LEARNED,
    MAX_WHOLE_LINE_CHARS,
    WORD_HEX,
    Range,
    h16,
    learn,
    learned_ranges,
    line_hashes,
    packed_memory,
    unpack,
    word_hashes,
)
from prefixgate.rewriter.analysis.note_placement import add_note, note_text, placeholder, resolve
from prefixgate.rewriter.analysis.pays import Verdict, block_pieces, judge, tools_piece
from prefixgate.rewriter.analysis.volatile_spans import Span, find_spans, per_request
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Prompt

NAME = "hoist_volatile"
MEMORY_KEY = "hoist_volatile"
NOTE_CONTEXT_CHARS = 300
MOVE_LINE_MAX_CHARS = 200
MOVE_LINE_MAX_CONTEXT = 64
"""A line moves whole when it is at most this long / holds at most this many characters
besides its moved spans (module docstring)."""
MAX_TRACKED_TOOLS = 128
"""Tool definitions whose hashes are remembered (to report changes); the rest are not tracked."""
NEW_TURN_TOKENS = 4
"""Chat-template tokens of the extra turn the note may open (role markers)."""

Spans = dict[int, list[Span]]


def _system_texts(prompt: Prompt) -> list[tuple[int, int, str]]:
    """``(message index, block index, text)`` of every system text block."""
    return [(mi, bi, b.text) for mi, m in enumerate(prompt.system)
            for bi, b in enumerate(m.blocks) if b.is_text]


@dataclass
class Moved:
    """What :func:`apply` made of the chosen spans: ``sent`` (the system texts to send),
    ``hashed`` (every span replaced by a placeholder, lines kept: what memory digests),
    ``lines`` (moved whole lines, note order), ``entries`` (placeholder ``n`` -> its context
    line, index ``n - 1``), ``first`` (``(block, offset)`` of the first change in ``sent``),
    ``delta`` (``[(inserted text, removed text)]``: what the move did to the system text)."""

    sent: list[str]
    hashed: list[str]
    lines: list[str]
    entries: list[str]
    first: tuple[int, int] | None
    delta: list[tuple[str, str]]


def _line_of(t: str, pos: int) -> tuple[int, int]:
    s = t.rfind("\n", 0, pos) + 1
    e = t.find("\n", pos)
    return s, (len(t) if e < 0 else e)


def _context(line: str, s: int, e: int) -> str:
    line_s = line.strip()
    if len(line_s) <= NOTE_CONTEXT_CHARS:
        return line_s
    a = max(0, s - NOTE_CONTEXT_CHARS // 2)
    return "…" + line[a:min(len(line), e + NOTE_CONTEXT_CHARS // 2)].strip() + "…"


def _by_line(t: str, sps: list[Span]) -> list[tuple[int, int, list[Span]]]:
    """Spans (sorted, non-overlapping) grouped by line: ``[(line start, line end, spans)]``."""
    out: list[tuple[int, int, list[Span]]] = []
    for sp in sps:
        if out and sp.start < out[-1][1]:
            out[-1][2].append(sp)
            continue
        ls, le = _line_of(t, sp.start)
        out.append((ls, le, [sp]))
    return out


def _moves_whole(t: str, ls: int, le: int, sps: list[Span]) -> bool:
    line = t[ls:le].strip()
    rest = len(line) - sum(sp.end - sp.start for sp in sps)
    return len(line) <= MOVE_LINE_MAX_CHARS and rest <= MOVE_LINE_MAX_CONTEXT


def _with_placeholders(t: str, sps: list[Span], n: int) -> str:
    parts, p = [], 0
    for sp in sps:
        parts += [t[p:sp.start], placeholder(n)]
        p = sp.end
    return "".join(parts) + t[p:]


def _apply_block(t: str, sps: list[Span], out: Moved, bi: int, whole_ok: bool) -> str:
    """The block's text to send (module docstring); records lines, entries, first, delta."""
    parts: list[str] = []
    pos = 0
    for ls, le, g in _by_line(t, sps):
        end = le + 1 if le < len(t) else le  # the line with its newline
        parts.append(t[pos:ls])
        if out.first is None:
            out.first = (bi, len("".join(parts)) + (0 if whole_ok and _moves_whole(t, ls, le, g)
                                                     else g[0].start - ls))
        if whole_ok and _moves_whole(t, ls, le, g):
            out.lines.append(t[ls:le].strip())
            out.delta.append(("", t[ls:end]))
        else:
            out.entries.append(_context(t[ls:le], g[0].start - ls, g[-1].end - ls))
            n = len(out.entries)
            parts.append(_with_placeholders(t[ls:end], [replace(sp, start=sp.start - ls,
                                                                end=sp.end - ls) for sp in g], n))
            out.delta += [(placeholder(n), t[sp.start:sp.end]) for sp in g]
        pos = end
    parts.append(t[pos:])
    sent = "".join(parts)
    if not t.endswith("\n") and sent.endswith("\n"):
        sent = sent[:-1]  # the last line moved: its newline went with the one before it
    return sent


def apply(texts: list[str], spans: Spans) -> Moved:
    """Move ``spans`` out of ``texts`` (module docstring, "How a span moves")."""
    out = Moved([], [], [], [], None, [])
    for bi, t in enumerate(texts):
        sps = sorted(spans.get(bi, []), key=lambda s: s.start)
        if not sps:
            out.sent.append(t)
            out.hashed.append(t)
            continue
        mark = (len(out.lines), len(out.entries), out.first, len(out.delta))
        sent = _apply_block(t, sps, out, bi, whole_ok=True)
        if not sent.strip():  # every line would go: placeholders instead, the block stays
            del out.lines[mark[0]:], out.entries[mark[1]:], out.delta[mark[3]:]
            out.first = mark[2]
            sent = _apply_block(t, sps, out, bi, whole_ok=False)
        out.sent.append(sent)
        out.hashed.append(_with_placeholders(t, sps, 0))
    return out


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


def _pays(prompt: Prompt, ctx: Context, moved: Moved, note: str) -> Verdict:
    """:func:`prefixgate.rewriter.analysis.pays.judge` for this move: stable before the first change,
    reusable from it to the note; added = note + turn markers + placeholders - moved text."""
    assert moved.first is not None
    bi, at = moved.first
    added = ctx.count_tokens(note) + NEW_TURN_TOKENS
    for ins, rem in moved.delta:
        added += (ctx.count_tokens(ins) if ins else 0) - ctx.count_tokens(rem)
    sent = moved.sent
    before = [*tools_piece(prompt), *sent[:bi], sent[bi][:at]]
    gained = [sent[bi][at:], *sent[bi + 1:],
              *(p for m in prompt.messages for p in block_pieces(m.blocks))]
    return judge(ctx.provider, ctx.model, before, gained, max(0, added), ctx.count_tokens)


def _overlaps(sp: Span | Range, r: Span | Range) -> bool:
    return sp.start < r.end and r.start < sp.end


def choose(texts: list[str], candidates: Spans, ranges: list[Range], learn_lines: bool
           ) -> tuple[Spans, list[str]]:
    """The spans to move (module docstring, "What is volatile"): candidates marked per-request,
    and for each range seen changing its candidates — or, with ``learn_lines`` and no
    candidate in it, the range itself. Returns ``({block: sorted spans}, skipped reasons)``."""
    chosen: Spans = {bi: [sp for sp in sps if per_request(texts[bi], sp)]
                     for bi, sps in candidates.items()}
    skipped: list[str] = []
    for r in ranges:
        inside = [sp for sp in candidates.get(r.block, []) if _overlaps(sp, r)]
        if inside:
            chosen.setdefault(r.block, []).extend(inside)
        elif learn_lines:
            if r.whole_line and r.end - r.start > MAX_WHOLE_LINE_CHARS:
                skipped.append(f"system block {r.block} line at {r.start} ({r.end - r.start} chars)")
                continue
            chosen.setdefault(r.block, []).append(Span("learned", r.start, r.end))
    out: Spans = {}
    for bi, sps in chosen.items():
        for sp in sorted(set(sps), key=lambda s: (s.start, -(s.end - s.start))):
            if not any(_overlaps(sp, q) for q in out.get(bi, [])):
                out.setdefault(bi, []).append(sp)
    return out, skipped


def _memory_in(ctx: Context) -> tuple[list[str], dict[str, list[str]], list[list[Any]], dict[str, Any]]:
    mem_in = ctx.session.get(MEMORY_KEY) or {}
    prev_lines = unpack(mem_in.get("lines"), LINE_DIGEST_CHARS)
    words_in = mem_in.get("words")
    prev_words = {k: unpack(v, WORD_HEX) for k, v in words_in.items()} \
        if isinstance(words_in, dict) else {}
    learned = [list(e) for e in mem_in.get("learned", [])
               if isinstance(e, (list, tuple)) and len(e) in (2, 4)]
    return prev_lines, prev_words, learned, mem_in.get("tools") or {}


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Hoist the volatile system spans (module docstring); Edits for the move and tool changes."""
    prev_lines, prev_words, learned, prev_tools = _memory_in(ctx)
    edits: list[Edit] = []
    tools_now = _tool_hashes(prompt)
    changed_tools = sorted(n for n, h in tools_now.items() if n in prev_tools and prev_tools[n] != h)
    if changed_tools:
        edits.append(Edit(NAME, False, "tools", "tool definitions changed since the previous "
                          "request (not moved): " + ",".join(changed_tools[:10])))

    texts = [t for _, _, t in _system_texts(prompt)]
    candidates: Spans = {bi: found for bi, t in enumerate(texts) if (found := find_spans(t))}
    learn_lines = ctx.settings.learn_volatility
    spans, skipped = choose(texts, candidates, learned_ranges(texts, learned), learn_lines)
    if prev_lines and texts:
        trial = apply(texts, spans).hashed
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
            spans, skipped = choose(texts, candidates, learned_ranges(texts, learned), learn_lines)
    moved = apply(texts, spans)
    lines_packed, words_packed = packed_memory(moved.hashed)
    memory = {MEMORY_KEY: {"lines": lines_packed, "words": words_packed,
                           "learned": [list(e) for e in learned], "tools": tools_now}}
    if skipped:
        edits.append(Edit(NAME, False, "system", "volatile lines too long to move: "
                          + ",".join(skipped[:5])))
    if moved.first is None:
        waiting = sorted({f"{sp.kind}@system.block{bi}" for bi, sps in candidates.items()
                          for sp in sps})
        why = (f"{sum(map(len, candidates.values()))} candidate span(s) [{','.join(waiting)}] "
               "not seen changing: left in place") if waiting else \
            "no volatile span in the system region"
        edits.append(Edit(NAME, False, "system", why, memory=memory))
        return prompt, edits
    placement = resolve(ctx.settings.hoist_target, prompt.api)
    note = note_text(moved.lines, moved.entries, placement)
    verdict = _pays(prompt, ctx, moved, note)
    if not verdict.pays:
        edits.append(Edit(NAME, False, "system", f"skipped, does not pay: {verdict.why}",
                          memory=memory))
        return prompt, edits
    placed = add_note(_with_system(prompt, moved.sent), note, placement)
    kinds = sorted({f"{sp.kind}@system.block{bi}" for bi, sps in spans.items() for sp in sps})
    if placed is None:
        edits.append(Edit(NAME, False, "system", "volatile spans found but no user turn to "
                          "carry them: " + ",".join(kinds), memory=memory))
        return prompt, edits
    out, where = placed
    before = after = ctx.count_tokens(note)  # a move: nothing removed
    edits.append(Edit(NAME, True, "system", f"moved {sum(map(len, spans.values()))} volatile "
                      f"span(s) [{','.join(kinds)}] to {where} ({placement})", before, after,
                      memory=memory, tokens_reusable=verdict.gain, tokens_added=verdict.added))
    return out, edits
