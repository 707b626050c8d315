"""Cache-break diagnosis: where and why a session's rendered prefix stopped matching the previous
request's.

Issue 37: a session's first request is no break, nor is a one-shot request after another (the
previous request had no assistant turn and the new one differs at or before the end of its first
user message, not by a volatile span: the README's samples, or one question asked from two SDKs,
under one session key). Every record keeps a **masked excerpt**: the line of the client's text
where the prefix diverged, its volatile spans named (``⟨datetime⟩``) and every other digit
``#``, at most :data:`prefixgate.cache.savings.break_spans.EXCERPT_CHARS` characters, and the
line's number in its block — enough to find the line, no number of the prompt, kept with prompt
storage off. Offsets and losses are in the caller's token counter over the blocks in the API's
order (``unit`` ``"estimate"``); :mod:`prefixgate.cache.savings.client_breaks` replaces them with
the backend's own token ids where the backend tokenizes (``unit`` ``"engine"``).

Per session, :class:`BreakDetector` keeps the block list of the last request (in memory, bounded
LRU of sessions). When a request's blocks are not an extension of the previous ones, it records a
:class:`BreakRecord`: the region, block and token offset of the first difference and its kind:

* ``volatile_span`` — the differing blocks are equal once dates, times, UUIDs, request ids and
  timestamps are masked (:mod:`prefixgate.cache.savings.break_spans`); case B03.
* ``reorder`` — the region holds the same multiset of blocks in a different order (tool order,
  case B04, or moved system blocks).
* ``tool_set_changed`` — tools added, removed or their definitions edited.
* ``system_edit`` — the system prompt changed otherwise.
* ``history_edit`` — an earlier message changed or was removed (pruning, truncation,
  elided observations).
* ``model_changed`` — the model id changed (caches are per model).

A break whose request our engine served by reusing the KV after the changed span (issue 33: the
engine's ``span_reused_tokens``, recorded as the break's ``bridged_tokens``) is *bridged*: its
cause is kept, but it is not a loss — the report says the engine bridged it and advises no
move for it (:func:`format_breaks`, :func:`break_advice`).

Append-only growth (the previous prefix is a prefix of the new one), pure truncation at the end,
and a volatile note in trailing blocks of the last message being replaced (how the rewriter's
hoisted clock moves forward each turn) are not breaks. Prompt text never leaves the detector unless
``store_text`` is set, and then only
as short excerpts around the divergence.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from prefixgate.cache.provider_models.kept_text import Kept, kept_block, text_of
from prefixgate.cache.provider_models.prefix_blocks import (
    Api,
    PrefixBlock,
    TokenCounter,
    common_prefix_len,
    detect_api,
    flatten,
    partial_tokens,
)
from prefixgate.cache.savings.break_spans import find_spans, kinds_in_diff, masked_excerpt

BreakKind = Literal["volatile_span", "reorder", "tool_set_changed", "system_edit",
                    "history_edit", "model_changed"]
EXCERPT_CHARS = 80


@dataclass(frozen=True)
class BreakRecord:
    """One prefix break.

    ``request_seq``: 0-based index of the request in its session; ``region``:
    ``"tools" | "system" | "messages"``; ``block_index`` / ``sub_index``: tool, system block or
    message index in the region, and content-block index in the message; ``flat_index``: block
    position in the whole prefix; ``token_offset``: tokens still shared with the previous
    request; ``tokens_lost``: tokens of the previous prefix after the divergence (no longer
    reusable); ``volatile_kinds``: e.g. ``("datetime",)``; ``excerpt_before`` /
    ``excerpt_after``: text around the divergence, only when the detector stores text;
    ``excerpt``: the masked line of the client's text where it diverged
    (:func:`prefixgate.cache.savings.break_spans.masked_excerpt`), ``line`` its number in the
    block (1-based; 0 when none); ``unit``: what ``token_offset`` / ``tokens_lost`` count —
    ``"estimate"`` (the caller's counter over blocks in the API's order) or ``"engine"`` (the
    backend's own token ids of the rendered prompt, from its start).
    ``bridged_tokens``: the tokens our engine reused across the changed span for this request
    (its ``span_reused_tokens``; 0: not bridged, the prefix after the divergence was lost).
    """

    session_id: str
    request_seq: int
    kind: str
    region: str
    block_index: int
    sub_index: int
    flat_index: int
    token_offset: int
    tokens_lost: int
    detail: str
    volatile_kinds: tuple[str, ...] = ()
    excerpt_before: str | None = None
    excerpt_after: str | None = None
    excerpt: str = ""
    line: int = 0
    unit: str = "estimate"
    bridged_tokens: int = 0

    @property
    def bridged(self) -> bool:
        """True when the engine reused KV across the changed span (not a loss)."""
        return self.bridged_tokens > 0

    @property
    def lost(self) -> int:
        """Prefix tokens this break lost: ``tokens_lost``, 0 when the engine bridged it."""
        return 0 if self.bridged else self.tokens_lost

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``volatile_kinds`` as a list)."""
        d = asdict(self)
        d["volatile_kinds"] = list(self.volatile_kinds)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BreakRecord:
        """The record of a stored :meth:`to_dict` (keys it does not know, such as the route a
        ledger adds, are left out; older records lack ``excerpt`` / ``line`` / ``unit``)."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in d.items() if k in known}
        kept["volatile_kinds"] = tuple(kept.get("volatile_kinds") or ())
        return cls(**kept)


@dataclass
class _SessionState:
    model: str
    blocks: list[PrefixBlock]  # a long text left out: in ``texts``, compressed
    seq: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    texts: dict[int, Kept] = field(default_factory=dict)

    def keep(self, blocks: list[PrefixBlock]) -> None:
        """Remember ``blocks``, each long text compressed (issue 34 item 17)."""
        self.blocks, self.texts = [], {}
        for i, b in enumerate(blocks):
            stripped, kept = kept_block(b)
            self.blocks.append(stripped)
            if kept is not None:
                self.texts[i] = kept

    def whole(self) -> list[PrefixBlock]:
        """The remembered blocks with their texts."""
        return [replace(b, text=text_of(self.texts[i])) if i in self.texts else b
                for i, b in enumerate(self.blocks)]


def _tool_name(block: PrefixBlock) -> str:
    try:
        obj = json.loads(block.text.split("\x00", 1)[1])
    except (IndexError, ValueError):
        return block.sha256[:8]
    if isinstance(obj, dict):
        fn = obj.get("function")
        if isinstance(fn, dict) and "name" in fn:
            return str(fn["name"])
        return str(obj.get("name", block.sha256[:8]))
    return block.sha256[:8]


def _region(blocks: list[PrefixBlock], region: str) -> list[PrefixBlock]:
    return [b for b in blocks if b.region == region]


def _volatile_tail(prev: list[PrefixBlock], d: int) -> bool:
    """True when the previous request's blocks from ``d`` on all belong to its last message and
    each holds a volatile span (a per-request note such as a hoisted clock, as a trailing block or
    a message of its own): only that note's tokens are lost, which no later request could reuse."""
    last = prev[-1]
    tail = prev[d:]
    return bool(tail) and all(
        b.region == last.region and b.index == last.index and find_spans(b.text) for b in tail)


def plain_text(block: PrefixBlock) -> str:
    """The text a reader would recognise in ``block``: a message's or system block's text
    parts (joined by newlines), else the block's JSON (a tool definition). Its canonical text
    is ``<role>\x00[...\x00]<json>``; JSON holds no raw NUL, so the JSON is what follows the
    last one."""
    raw = block.text.rsplit("\x00", 1)[-1]
    try:
        obj = json.loads(raw)
    except ValueError:
        return raw
    return _text_of(obj) if isinstance(obj, dict) and block.region != "tools" else raw


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        for key in ("text", "content", "thinking"):
            if key in value:
                return _text_of(value[key])
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)


def _one_shot_after_one_shot(prev: list[PrefixBlock], cur: list[PrefixBlock], d: int) -> bool:
    """True when the previous request had no assistant turn and ``cur`` differs from it in the
    messages at or before the end of its first user message, not by volatile spans alone: a
    new question under the same session key (a one-shot sample run from two SDKs, key order
    and all), not a conversation whose prefix broke."""
    msgs = [b for b in prev if b.region == "messages"]
    if any(b.role == "assistant" for b in msgs) or prev[d].region != "messages":
        return False
    first_user = next((b.index for b in msgs if b.role == "user"), None)
    if first_user is None or prev[d].index > first_user:
        return False
    return d >= len(cur) or not kinds_in_diff(prev[d].text, cur[d].text)


def _excerpt(text: str, at: int) -> str:
    start = max(0, at - EXCERPT_CHARS // 2)
    return text[start:start + EXCERPT_CHARS]


class BreakDetector:
    """Track sessions' rendered prefixes and report breaks.

    ``store_text``: put excerpts in records (policy ``store_prompt_text``); ``max_sessions``:
    sessions remembered (least recently seen forgotten first).
    """

    def __init__(self, store_text: bool = False, max_sessions: int = 4096) -> None:
        self.store_text = store_text
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, _SessionState] = OrderedDict()

    def forget(self, session_id: str) -> None:
        """Drop a session's remembered prefix."""
        self._sessions.pop(session_id, None)

    def observe(self, session_id: str, body: dict[str, Any], count_tokens: TokenCounter,
                api: Api | None = None,
                blocks: list[PrefixBlock] | None = None) -> BreakRecord | None:
        """Compare ``body`` (wire body as sent upstream) with the session's previous request.

        Returns a :class:`BreakRecord` when the prefix diverged, else ``None`` (first request,
        append-only growth, identical or truncated-at-the-end prefix). ``api`` defaults to
        :func:`~prefixgate.cache.provider_models.prefix_blocks.detect_api`; ``blocks``: the body
        already flattened (saves work). Raises ``TypeError`` on malformed messages.
        """
        if blocks is None:
            blocks = flatten(body, api or detect_api(body), count_tokens)
        model = str(body.get("model", ""))
        state = self._sessions.get(session_id)
        if state is None:
            state = self._sessions[session_id] = _SessionState(model, [])
            state.keep(blocks)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            return None
        self._sessions.move_to_end(session_id)
        state.seq += 1
        prev, prev_model = state.blocks, state.model
        was = _SessionState(prev_model, prev, texts=state.texts)
        state.keep(blocks)
        state.model = model
        if model != prev_model:
            total = sum(b.tokens for b in prev)
            return BreakRecord(session_id, state.seq, "model_changed", "tools", 0, 0, 0, 0, total,
                               f"model {prev_model!r} -> {model!r}")
        d = 0
        n = min(len(prev), len(blocks))
        while d < n and prev[d].sha256 == blocks[d].sha256:
            d += 1
        if d >= n:
            return None  # append-only, identical, or a prefix of the previous request
        prev = was.whole()  # a break: the previous request's long texts unpacked, once
        if _volatile_tail(prev, d):
            return None  # only a volatile note at the very end moved on: nothing reusable lost
        if _one_shot_after_one_shot(prev, blocks, d):
            return None  # another question under the same session key, not a broken prefix
        return self._classify(session_id, state.seq, prev, blocks, d)

    def _classify(self, session_id: str, seq: int, prev: list[PrefixBlock],
                  cur: list[PrefixBlock], d: int) -> BreakRecord:
        pb, cb = prev[d], cur[d]
        shared = sum(b.tokens for b in prev[:d]) + partial_tokens(cb, pb.text)
        lost = sum(b.tokens for b in prev) - shared
        kind, detail, vkinds = self._kind(prev, cur, pb, cb)
        before = after = None
        if self.store_text:
            at = common_prefix_len(pb.text, cb.text)
            before, after = _excerpt(pb.text, at), _excerpt(cb.text, at)
        prev_plain, cur_plain = plain_text(pb), plain_text(cb)
        excerpt, line = masked_excerpt(cur_plain, common_prefix_len(prev_plain, cur_plain))
        return BreakRecord(session_id, seq, kind, cb.region, cb.index, cb.sub, d, shared, lost,
                           detail, tuple(vkinds), before, after, excerpt, line)

    @staticmethod
    def _kind(prev: list[PrefixBlock], cur: list[PrefixBlock], pb: PrefixBlock,
              cb: PrefixBlock) -> tuple[str, str, list[str]]:
        if pb.region == cb.region:
            vk = kinds_in_diff(pb.text, cb.text)
            if vk:
                detail = f"{cb.region}[{cb.index}] differs only in {', '.join(vk)}"
                return "volatile_span", detail, vk
        if "tools" in (pb.region, cb.region):
            pt, ct = _region(prev, "tools"), _region(cur, "tools")
            if Counter(b.sha256 for b in pt) == Counter(b.sha256 for b in ct):
                return "reorder", f"same {len(ct)} tools in another order", []
            pn, cn = {_tool_name(b) for b in pt}, {_tool_name(b) for b in ct}
            added, removed = sorted(cn - pn), sorted(pn - cn)
            if added or removed:
                return "tool_set_changed", f"added {added}, removed {removed}", []
            return "tool_set_changed", f"definition of {_tool_name(cb)!r} changed", []
        region = cb.region
        pr, cr = _region(prev, region), _region(cur, region)
        if region != "messages" and Counter(b.sha256 for b in pr) == \
                Counter(b.sha256 for b in cr):
            return "reorder", f"same {len(cr)} {region} blocks in another order", []
        if region == "system" or pb.region == "system":
            return "system_edit", f"system block {cb.index} changed", []
        if len(cr) < len(pr) and {b.sha256 for b in cr} <= {b.sha256 for b in pr}:
            n_gone = len(pr) - len(cr)
            return "history_edit", f"{n_gone} history blocks removed from message {pb.index} on", []
        return "history_edit", f"message {pb.index} ({pb.role}) block {pb.sub} changed", []


def count_by_kind(records: list[BreakRecord]) -> dict[str, int]:
    """``{kind: number of breaks}`` in first-seen order."""
    out: dict[str, int] = {}
    for r in records:
        out[r.kind] = out.get(r.kind, 0) + 1
    return out


def format_breaks(records: list[BreakRecord], width: int = 80) -> str:
    """Plain-text table of breaks for ``prefixgate report --breaks`` (one row per record with
    its masked line below it, then totals by kind and the unit of the offsets), every line at
    most ``width`` columns (a terminal's 80 by default): a detail or excerpt that does not fit
    goes on indented lines below its row. Empty input gives ``"no cache breaks recorded"``."""
    if not records:
        return "no cache breaks recorded"
    header = f"{'session':<10} {'req':>4} {'kind':<17} {'where':<16} {'offset':>7} {'lost':>7}"
    lines = [header + "  detail", "-" * min(width, len(header) + 8)]
    indent = " " * 6
    for r in records:
        where = f"{r.region}[{r.block_index}]" + (f".{r.sub_index}" if r.sub_index else "")
        row = (f"{r.session_id[:10]:<10} {r.request_seq:>4} {r.kind[:17]:<17} {where[:16]:<16} "
               f"{r.token_offset:>7} {r.lost:>7}")
        detail = r.detail + (f"; bridged by the engine ({r.bridged_tokens} tokens reused "
                             "across the changed span)" if r.bridged else "")
        if len(row) + 2 + len(detail) <= width:
            lines.append(f"{row}  {detail}".rstrip())
        else:
            lines.append(row)
            lines += textwrap.wrap(detail, width, initial_indent=indent, subsequent_indent=indent)
        if r.excerpt:  # the masked line (digits masked): kept with prompt storage off
            lines += textwrap.wrap(f"line {r.line}: \"{r.excerpt}\"", width,
                                   initial_indent=indent, subsequent_indent=indent + "  ")
        if r.excerpt_before is not None:
            for label, text in (("before: ", r.excerpt_before), ("after:  ", r.excerpt_after)):
                lines += textwrap.wrap(f"{label}{text!r}", width, initial_indent=indent,
                                       subsequent_indent=indent + " " * len(label))
    totals = ", ".join(f"{k}: {v}" for k, v in count_by_kind(records).items())
    bridged = [r for r in records if r.bridged]
    by_engine = (f" ({len(bridged)} bridged by the engine: "
                 f"{sum(r.bridged_tokens for r in bridged)} tokens reused across the changed "
                 "spans, not counted as lost)" if bridged else "")
    units = {r.unit for r in records}
    unit = ("the backend's own tokens" if units == {"engine"} else "estimated tokens"
            if units == {"estimate"} else "the backend's own tokens where it tokenizes, else "
            "estimated")
    lines += textwrap.wrap(f"{len(records)} break(s) — {totals}; "
                           f"{sum(r.lost for r in records)} prefix tokens lost{by_engine} (offsets "
                           f"and losses in {unit}, from the start of the prompt)", width)
    advice = break_advice(records)
    if advice:
        lines += textwrap.wrap(advice, width)
    return "\n".join(lines)


def break_advice(records: list[BreakRecord]) -> str:
    """What would recover the prefix lost to volatile spans, or ``""`` when none broke it:
    ``hoist_volatile`` forced on (it ships ``guarded``, on for a route only once a trial shows
    its answers keep, because it moves text the model reads:
    :data:`prefixgate.config.schema.MOVES_THE_MODEL_READS`). Breaks the engine bridged lost
    nothing, so they ask for no move."""
    lost = sum(r.lost for r in records if r.kind == "volatile_span")
    if not lost:
        return ""
    return (f"{lost} of those tokens were lost to a changing clock / id: `rewrite.hoist_volatile: "
            "true` moves such a line after the conversation (it can change answers: by default "
            "`guarded`, on for a route once a trial there shows its answers keep; README, "
            "\"What prefixgate changes\")")
