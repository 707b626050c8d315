"""Pass: keep the retrieved passages that matter, whole, in a canonical order.

Rule. Retrieval-augmented prompts carry many passages of which few answer the question (NQ-open: one
gold passage among 20; tau2 banking: ~10 required of 698 documents). Only *retrieved* content is
ever a passage (issue 8, class 3): Anthropic ``document`` / ``search_result`` blocks, tool results
(tagged chunks, numbered ``[n]`` passages, policy delimiters), and, inside a user's own text, only
chunks tagged as injected retrieval (:data:`prefixgate.rewriter.analysis.passages.RETRIEVAL_TAGS`) —
a user's numbered list or ``---`` sections are never passages. Per retrieval (one text, or one
message's run of blocks) whose passages together exceed ``settings.rag_budget_tokens``:

1. scored with BM25 against the query — the message's own text outside the passages, the
   arguments of the tool call a tool result answers, and (when that is short) the newest earlier
   user text;
2. de-duplicated (:mod:`prefixgate.rewriter.passes.dedupe`: a passage whose whole text another one
   carries goes — lossless; passages that are only similar are not duplicates);
3. kept best first while they fit ``settings.rag_budget_tokens`` (the best one is always kept);
4. emitted in canonical order (:func:`prefixgate.rewriter.analysis.passages.id_order_key` of their
   stable ids), so the same retrieval gives the same bytes whatever order the retriever returned.

A retrieval at or under budget is left byte-identical — duplicates included. Passages are never cut: ids,
tags and citation markers inside them stay. Anthropic blocks with ``citations.enabled`` are never
moved or dropped (responses cite them by position). System prompts and assistant turns are not
touched. The decision for a message depends only on that message and earlier ones, so a history
re-sent on the next turn is pruned to the same bytes (append-only stays append-only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from prefixgate.rewriter.analysis.bm25 import bm25_scores, terms
from prefixgate.rewriter.analysis.passages import (
    block_passage,
    citations_enabled,
    find_passages,
    id_order_key,
    splice,
)
from prefixgate.rewriter.passes.dedupe import near_duplicates
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Block, Message, Prompt, with_key

NAME = "prune_rag"
MIN_OWN_QUERY_TERMS = 5


@dataclass(frozen=True)
class Selection:
    """Outcome of :func:`select_passages` for one retrieval.

    ``kept``: indices into the input, in canonical emission order; ``duplicates``: indices
    dropped as near-duplicates (``duplicate_tokens`` of them); ``tokens_before`` /
    ``tokens_after``: passage tokens in / kept.
    """

    kept: tuple[int, ...]
    duplicates: frozenset[int]
    tokens_before: int
    tokens_after: int
    duplicate_tokens: int = 0



def select_passages(ids: Sequence[str], bodies: Sequence[str], tokens: Sequence[int],
                    query: Sequence[str], budget: int, *, scores: Sequence[float] | None = None,
                    duplicates: frozenset[int] | set[int] | None = None) -> Selection:
    """Choose passages of one retrieval: BM25 score, drop near-duplicates, fill ``budget``.

    ``ids``/``bodies``/``tokens``: per passage (stable id, text to score, token count); ``query``:
    analysed query terms (:func:`prefixgate.rewriter.analysis.bm25.terms`); ``budget``: tokens. The
    best passage is kept even when it alone exceeds the budget; the others are taken best first
    (ties: canonical id order) when they still fit. A retrieval whose passages fit the budget
    together is kept whole and in its own order (nothing is dropped under budget, not even a
    duplicate). ``scores`` / ``duplicates``: precomputed BM25 scores / redundant-passage indices
    (benchmarks over a fixed corpus). Pure, deterministic.
    """
    n = len(ids)
    if sum(tokens) <= budget:
        return Selection(tuple(range(n)), frozenset(), sum(tokens), sum(tokens))
    if scores is None:
        scores = bm25_scores([terms(b) for b in bodies], query)
    dups = near_duplicates(bodies, scores) if duplicates is None else set(duplicates)
    order = sorted((i for i in range(n) if i not in dups),
                   key=lambda i: (-scores[i], id_order_key(ids[i]), i))
    kept: list[int] = []
    used = 0
    for i in order:
        if not kept or used + tokens[i] <= budget:
            kept.append(i)
            used += tokens[i]
    kept.sort(key=lambda i: (id_order_key(ids[i]), i))
    return Selection(tuple(kept), frozenset(dups), sum(tokens), used,
                     sum(tokens[i] for i in dups))


def _user_residual(msg: Message, delimiters: Sequence[str]) -> str:
    parts = []
    for b in msg.blocks:
        if b.is_text and not b.volatile:
            t = b.text
            ps = find_passages(t, delimiters, retrieved=False)
            parts.append(splice(t, ps, [], delimiters) if ps else t)
    return "\n".join(parts)


@dataclass
class _History:
    """What :func:`_query` reads from the messages before the current one, kept up to date as
    :func:`run` walks forward (the old backward walk per message was quadratic: 50,000
    messages of tool results took seconds). ``args``: tool call id -> arguments of the newest
    call with that id; ``user_terms``: terms of the newest user text with any."""

    args: dict[str, str]
    user_terms: list[str]

    def after(self, msg: Message, ctx: Context) -> None:
        """Take ``msg`` into account (call once per message, in order)."""
        seen: set[str] = set()
        for b in msg.blocks:  # the first call with an id in a message wins, as before
            if b.type == "tool_use" and b.tool_id and b.tool_id not in seen:
                seen.add(b.tool_id)
                fn = b.raw.get("function")
                args = fn.get("arguments") if isinstance(fn, dict) else b.raw.get("input")
                self.args[b.tool_id] = args if isinstance(args, str) else json.dumps(
                    args, ensure_ascii=False)
        if msg.role == "user":
            found = terms(_user_residual(msg, ctx.settings.rag_delimiters))
            if found:
                self.user_terms = found


def _query(hist: _History, own: str, tool_id: str | None) -> list[str]:
    text = own
    if tool_id:
        text += "\n" + hist.args.get(tool_id, "")
    q = terms(text)
    if len(q) < MIN_OWN_QUERY_TERMS and hist.user_terms:
        q = q + hist.user_terms
    return q


@dataclass
class _Tally:
    groups: int = 0
    passages: int = 0
    kept: int = 0
    dups: int = 0
    before: int = 0
    after: int = 0
    skipped_citations: int = 0
    dup_tokens: int = 0

    def add(self, n: int, sel: Selection) -> None:
        self.groups += 1
        self.passages += n
        self.kept += len(sel.kept)
        self.dups += len(sel.duplicates)
        self.before += sel.tokens_before
        self.after += sel.tokens_after
        self.dup_tokens += sel.duplicate_tokens


def _prune_text(text: str, query: list[str], ctx: Context, tally: _Tally,
                retrieved: bool) -> str:
    ps = find_passages(text, ctx.settings.rag_delimiters, retrieved=retrieved)
    if not ps:
        return text
    toks = [ctx.count_tokens(text[p.start:p.end]) for p in ps]
    sel = select_passages([p.pid for p in ps], [p.body for p in ps], toks, query,
                          ctx.settings.rag_budget_tokens)
    if len(sel.kept) == len(ps):
        return text
    tally.add(len(ps), sel)
    return splice(text, ps, [ps[i] for i in sel.kept], ctx.settings.rag_delimiters)


def _prune_block_run(blocks: list[Block], query: list[str], ctx: Context,
                     tally: _Tally) -> list[Block]:
    """Blocks of one message (or one tool_result's content) with document/search_result blocks
    pruned; other blocks keep their positions, kept passages fill the first passage slots."""
    slots = [i for i, b in enumerate(blocks) if block_passage(b.raw) is not None]
    if len(slots) < 2:
        return blocks
    if any(citations_enabled(blocks[i].raw) for i in slots):
        tally.skipped_citations += 1
        return blocks
    found = [block_passage(blocks[i].raw) for i in slots]
    ids = [f[0] for f in found if f]
    bodies = [f[1] for f in found if f]
    toks = [ctx.count_tokens(json.dumps(blocks[i].raw, ensure_ascii=False)) for i in slots]
    sel = select_passages(ids, bodies, toks, query, ctx.settings.rag_budget_tokens)
    if len(sel.kept) == len(slots):
        return blocks
    tally.add(len(slots), sel)
    kept_blocks = [blocks[slots[i]] for i in sel.kept]
    out: list[Block] = []
    filled = 0
    for i, b in enumerate(blocks):
        if i in slots:
            if filled < len(kept_blocks):
                out.append(kept_blocks[filled])
                filled += 1
        else:
            out.append(b)
    return out


def _prune_tool_result(block: Block, query: list[str], ctx: Context, tally: _Tally) -> Block:
    content = block.raw.get("content")
    if isinstance(content, str):
        new = _prune_text(content, query, ctx, tally, retrieved=True)
        return block if new == content else replace(block, raw=with_key(block.raw, "content", new))
    if isinstance(content, list) and all(isinstance(c, dict) for c in content):
        inner = [Block(str(c.get("type", "")), c) for c in content]
        inner = _prune_block_run(inner, query, ctx, tally)
        inner = [_prune_text_block(b, query, ctx, tally, retrieved=True) for b in inner]
        new_list = [b.raw for b in inner]
        if new_list != content:
            return replace(block, raw=with_key(block.raw, "content", new_list))
    return block


def _prune_text_block(b: Block, query: list[str], ctx: Context, tally: _Tally, *,
                      retrieved: bool) -> Block:
    """A text block with its passages pruned; ``retrieved``: the text is a tool result's (all
    passage forms) rather than a user's own (injected retrieval tags only)."""
    if not b.is_text or b.volatile:
        return b
    new = _prune_text(b.text, query, ctx, tally, retrieved)
    return b if new == b.text else b.with_text(new)


def _prune_message(msg: Message, hist: _History, ctx: Context, tally: _Tally) -> Message:
    delims = ctx.settings.rag_delimiters
    if msg.role == "tool":
        q = _query(hist, "", msg.tool_call_id)
        return msg.with_blocks([_prune_text_block(b, q, ctx, tally, retrieved=True)
                                for b in msg.blocks])
    if msg.role != "user":
        return msg
    own = _user_residual(msg, delims)
    blocks = list(msg.blocks)
    new_blocks: list[Block] = []
    for b in blocks:
        if b.type == "tool_result":
            q = _query(hist, "", b.tool_id)
            new_blocks.append(_prune_tool_result(b, q, ctx, tally))
        else:
            new_blocks.append(_prune_text_block(b, _query(hist, own, None), ctx, tally,
                                                retrieved=False))
    new_blocks = _prune_block_run(new_blocks, _query(hist, own, None), ctx, tally)
    if all(a is b for a, b in zip(new_blocks, blocks)) and len(new_blocks) == len(blocks):
        return msg
    return msg.with_blocks(new_blocks)


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Prune passages in user messages and tool results; one Edit (``region="messages"``)."""
    tally = _Tally()
    hist = _History({}, [])
    out: list[Message] = []
    for msg in prompt.messages:
        out.append(_prune_message(msg, hist, ctx, tally))
        hist.after(msg, ctx)  # the client's message: later queries read what the client sent
    messages = tuple(out)
    if tally.groups == 0:
        why = "no retrieval over budget"
        if tally.skipped_citations:
            why += f"; {tally.skipped_citations} cited block run(s) left in place"
        return prompt, [Edit(NAME, False, "messages", why)]
    by_budget = tally.before - tally.after - tally.dup_tokens
    detail = (f"{tally.groups} retrieval(s), kept {tally.kept} of {tally.passages} passages: "
              f"dedupe dropped {tally.dups} contained (-{tally.dup_tokens} tokens), bm25 budget of "
              f"{ctx.settings.rag_budget_tokens} tokens dropped the rest (-{by_budget} tokens)")
    if tally.skipped_citations:
        detail += f"; {tally.skipped_citations} cited block run(s) left in place"
    return replace(prompt, messages=messages), [
        Edit(NAME, True, "messages", detail, tally.before, tally.after)]
