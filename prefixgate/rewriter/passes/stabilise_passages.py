"""Pass: injected passages keep the order in which the session first saw them.

Rule. RAG and memory layers inject the same passages in a different order on each turn (re-ranking,
set iteration). The text before the first moved passage is all the prefix cache can reuse, so a swap
near the top of a system prompt costs the whole prompt. This pass puts every retrieval
(:func:`prefixgate.rewriter.analysis.passage_forms.find_retrieval` in system text, user text and
tool results; runs of Anthropic ``document`` / ``search_result`` blocks) in a session-stable order:

* a passage seen earlier in the session comes first, in the order the session first saw it;
* passages new to the session follow, in the order the client sent them;
* nothing is added or removed, every passage keeps its own label (id attribute, ``[n]``,
  ``Document N:``, heading), and only the passages move — the text between them stays in place.

So turn 2's retrieval renders as turn 1's did (plus new passages after), and a history re-sent on
a later turn renders to the same bytes it had when it was the newest message.

Never moved: assistant turns; a run of blocks with ``citations.enabled`` (responses cite them by
position) or with a ``cache_control`` marker; passages whose gaps hold content; a user's own lists
or sections (:mod:`prefixgate.rewriter.analysis.passage_forms`, "origin"); a retrieval whose order carries
meaning — ranked, "most relevant first", "trust the first", dated, versioned, scored — by its own
text, the text around it or the prompt's instructions
(:func:`prefixgate.rewriter.analysis.order_meaning.order_reason`,
issue 19 item 7): it goes out in the client's order and the Edit says why.

Retrievals are found by their markup and by their structure (a run of labelled sibling
elements of one shape, whatever the tag name: ``passage_forms`` form 6).

Memory (``Edit.memory["passage_order"]``): ``{"seen": "<8 base64 chars per passage>"}`` — a
48-bit digest of each passage's whitespace-normalised text (never the text) in first-seen order,
at most :data:`MAX_SEEN` (later passages are then treated as new each time: bounded, and what was
recorded never changes, so re-sent history stays byte-identical).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prefixgate.rewriter.analysis.order_meaning import order_reason, surroundings
from prefixgate.rewriter.analysis.passage_forms import Origin, find_retrieval, reorder
from prefixgate.rewriter.analysis.passages import Passage, block_passage, citations_enabled
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Block, Message, Prompt, with_key

NAME = "stabilise_passages"
MEMORY_KEY = "passage_order"
MAX_SEEN = 512
DIGEST_CHARS = 8
DOC_BLOCKS = frozenset({"document", "search_result"})


def digest(text: str) -> str:
    """:data:`DIGEST_CHARS`-character digest (48 bits of sha256, url-safe base64) of the
    whitespace-normalised text."""
    raw = hashlib.sha256(" ".join(text.split()).encode("utf-8", "surrogatepass")).digest()
    return base64.urlsafe_b64encode(raw[:6]).decode()


def block_digest(block: Mapping[str, Any]) -> str:
    """Digest of a document / search_result block's canonical JSON (``cache_control`` aside)."""
    return digest(json.dumps({k: v for k, v in block.items() if k != "cache_control"},
                             sort_keys=True, ensure_ascii=False))


@dataclass
class SeenOrder:
    """First-seen rank of each passage digest in a session; grows in emission order."""

    ranks: dict[str, int] = field(default_factory=dict)
    added: bool = False

    @staticmethod
    def from_memory(mem: Any) -> SeenOrder:
        """Read ``{"seen": packed}`` (anything malformed reads as empty)."""
        packed = mem.get("seen") if isinstance(mem, Mapping) else None
        if not isinstance(packed, str) or len(packed) % DIGEST_CHARS:
            return SeenOrder()
        ds = [packed[i:i + DIGEST_CHARS] for i in range(0, len(packed), DIGEST_CHARS)]
        return SeenOrder({d: r for r, d in reversed(list(enumerate(ds[:MAX_SEEN])))})

    def order(self, digests: Sequence[str]) -> list[int]:
        """Emission order of passages with ``digests`` (text order); records the new ones.

        Seen passages first by first-seen rank, then new ones in text order. A group that
        holds one passage twice keeps its order (a rank cannot place both copies stably)."""
        if len(set(digests)) != len(digests):
            for d in digests:
                self._record(d)
            return list(range(len(digests)))
        seen = sorted((i for i, d in enumerate(digests) if d in self.ranks),
                      key=lambda i: (self.ranks[digests[i]], i))
        new = [i for i, d in enumerate(digests) if d not in self.ranks]
        for i in new:
            self._record(digests[i])
        return seen + new

    def _record(self, d: str) -> None:
        if d not in self.ranks and len(self.ranks) < MAX_SEEN:
            self.ranks[d] = len(self.ranks)
            self.added = True

    def memory(self) -> dict[str, Any]:
        """``{"passage_order": {"seen": packed}}`` in rank order."""
        return {MEMORY_KEY: {"seen": "".join(sorted(self.ranks, key=self.ranks.__getitem__))}}


@dataclass
class _Tally:
    """What :func:`stabilise` did; ``kept``: why each retrieval left as sent was left so;
    ``instructions``: the prompt's system text (read by :func:`order_reason`)."""

    moved_groups: int = 0
    moved_passages: int = 0
    tokens: int = 0
    regions: set[str] = field(default_factory=set)
    kept: list[str] = field(default_factory=list)
    instructions: str = ""


def _stabilise_text(text: str, origin: Origin, seen: SeenOrder, tally: _Tally,
                    count: Callable[[str], int], region: str) -> str:
    ps: list[Passage] = find_retrieval(text, origin)
    if not ps:
        return text
    span = text[ps[0].start:ps[-1].end]
    instructions = tally.instructions.replace(span, "", 1) if origin == "system" else tally.instructions
    why = order_reason(surroundings(text, ps[0].start, ps[-1].end),
                       [text[p.start:p.end] for p in ps], instructions)
    if why:
        seen.order([digest(text[p.start:p.end]) for p in ps])  # seen, in the client's order
        tally.kept.append(why)
        return text
    order = seen.order([digest(text[p.start:p.end]) for p in ps])
    if order == list(range(len(ps))):
        return text
    tally.moved_groups += 1
    tally.moved_passages += sum(1 for k, i in enumerate(order) if k != i)
    tally.tokens += count(text)
    tally.regions.add(region)
    return reorder(text, ps, order)


def _stabilise_runs(blocks: list[Any], seen: SeenOrder, tally: _Tally, region: str,
                    raw_of: Callable[[Any], Mapping[str, Any]]) -> list[Any]:
    """Reorder each maximal run (2+) of document / search_result blocks in ``blocks``."""
    out = list(blocks)
    i = 0
    while i < len(out):
        j = i
        while j < len(out) and raw_of(out[j]).get("type") in DOC_BLOCKS:
            j += 1
        if j - i >= 2:
            run = out[i:j]
            raws = [raw_of(b) for b in run]
            texts = [p[1] if (p := block_passage(r)) else "" for r in raws]
            why = order_reason("", texts, tally.instructions)
            if why:
                tally.kept.append(why)
            if not why and not any(citations_enabled(r) or isinstance(r.get("cache_control"), dict)
                                   for r in raws):
                order = seen.order([block_digest(r) for r in raws])
                if order != list(range(len(run))):
                    out[i:j] = [run[k] for k in order]
                    tally.moved_groups += 1
                    tally.moved_passages += sum(1 for k, x in enumerate(order) if k != x)
                    tally.regions.add(region)
        i = max(j, i + 1)
    return out


def _tool_result(block: Block, seen: SeenOrder, tally: _Tally, count: Callable[[str], int]
                 ) -> Block:
    content = block.raw.get("content")
    if isinstance(content, str):
        new = _stabilise_text(content, "tool", seen, tally, count, "messages")
        return block if new is content else replace(block, raw=with_key(block.raw, "content", new))
    if not isinstance(content, list):
        return block
    items: list[Any] = []
    for c in content:
        if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str):
            new = _stabilise_text(c["text"], "tool", seen, tally, count, "messages")
            items.append(c if new is c["text"] else with_key(c, "text", new))
        else:
            items.append(c)
    items = _stabilise_runs(items, seen, tally, "messages",
                            lambda c: c if isinstance(c, dict) else {})
    if all(a is b for a, b in zip(items, content)):
        return block
    return replace(block, raw=with_key(block.raw, "content", items))


def _message(msg: Message, origin: Origin, seen: SeenOrder, tally: _Tally,
             count: Callable[[str], int], region: str) -> Message:
    blocks: list[Block] = []
    for b in msg.blocks:
        if b.is_text:
            new = _stabilise_text(b.text, origin, seen, tally, count, region)
            blocks.append(b if new is b.text else b.with_text(new))
        elif b.type == "tool_result":
            blocks.append(_tool_result(b, seen, tally, count))
        else:
            blocks.append(b)
    if origin == "user":
        blocks = _stabilise_runs(blocks, seen, tally, region, lambda b: b.raw)
    if all(a is b for a, b in zip(blocks, msg.blocks)):
        return msg
    return msg.with_blocks(blocks)


def stabilise(prompt: Prompt, seen: SeenOrder, count: Callable[[str], int]
              ) -> tuple[Prompt, _Tally]:
    """The prompt with every retrieval in session-stable order (module docstring); ``seen``
    grows with the passages met, in prompt order (system, then messages)."""
    tally = _Tally(instructions="\n".join(
        b.text for m in (*prompt.system, *(m for m in prompt.messages if m.role in ("system", "developer")))
        for b in m.blocks if b.is_text))
    system = tuple(_message(m, "system", seen, tally, count, "system") for m in prompt.system)
    messages = []
    for m in prompt.messages:
        if m.role == "user":
            messages.append(_message(m, "user", seen, tally, count, "messages"))
        elif m.role == "tool":
            messages.append(_message(m, "tool", seen, tally, count, "messages"))
        elif m.role in ("system", "developer"):
            messages.append(_message(m, "system", seen, tally, count, "messages"))
        else:
            messages.append(m)
    if not tally.moved_groups:
        return prompt, tally
    return replace(prompt, system=system, messages=tuple(messages)), tally


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """The pass (module docstring). One Edit; its memory is written back even when nothing
    moved, so the first turn's passages are remembered."""
    seen = SeenOrder.from_memory(ctx.session.get(MEMORY_KEY))
    out, tally = stabilise(prompt, seen, ctx.count_tokens)
    memory = seen.memory() if seen.added else {}
    kept = (f"; {len(tally.kept)} retrieval(s) left in the client's order: "
            + "; ".join(dict.fromkeys(tally.kept))) if tally.kept else ""
    if not tally.moved_groups:
        return prompt, [Edit(NAME, False, "messages", "no retrieval out of its first-seen order"
                             + kept, memory=memory)]
    region = next(iter(tally.regions)) if len(tally.regions) == 1 else "system+messages"
    return out, [Edit(NAME, True, region,
                      f"{tally.moved_passages} passage(s) of {tally.moved_groups} retrieval(s) "
                      "put back in first-seen order" + kept, tally.tokens, tally.tokens, memory)]
