"""The meaning invariant for the whole proxy: what the client sent reaches the upstream, in order.

:func:`meaning_violations` compares the client's transcript (:mod:`tests.fuzz.transcript`) with
the upstream's. Rule (issue 8, "Invariants as code"; DESIGN.md "Invariants"): every authored
character and every tool call, tool result and media item of the client's request reaches the
upstream in order, except what a pruning pass that *reports it applied* may remove:

* ``prune_rag`` — retrieved passages (tagged chunks, ``[n]`` passages, policy-delimited
  segments, found here by :func:`passage_spans`, an implementation independent of the
  rewriter's), document / search-result blocks, tool-result contents; passages may be
  re-ordered within their retrieval, so their text is checked for presence, not order;
* ``prune_history`` — whole old messages and elided tool-result contents, never the first user
  turn;
* ``hoist_volatile`` — system-prompt spans move to a note at the end: the system text is then
  checked word by word for presence anywhere upstream.

The proxy may add text (notes, placeholders, separators). Two client text blocks that arrive
glued into one upstream string with nothing between them are reported (``glued_blocks``): the
boundary was meaning (a list item, a document edge) and is gone.

Matching: the upstream's units become one string (atoms as private-use code points); each
client text must be found whole after the cursor (a text that arrives split or with insertions
inside it counts as missing).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass

from tests.fuzz.transcript import Atom, Msg, Text

_PUA = 0xF0000
_TAGS = ("document", "doc", "passage", "ctx", "chunk", "search_result", "source", "context",
         "result", "snippet", "article", "reference")
_NUMBERED = re.compile(r"(?m)^[ \t]*\[(\d{1,4})\]")


@dataclass(frozen=True)
class Violation:
    """One broken invariant: ``kind`` (a defect-class key) and ``detail`` (what, where)."""

    kind: str
    detail: str


def passage_spans(text: str, delimiters: tuple[str, ...]) -> list[tuple[int, int]]:
    """Spans of retrieved passages in ``text`` (two or more of one form, else none): tagged
    ``<tag ...>..</tag>`` elements, ``[n]`` numbered lines (to the next marker / blank line),
    segments between policy delimiters."""
    low = text.lower()
    for tag in _TAGS:
        if low.count(f"</{tag}>") >= 2:
            spans = [m.span() for m in re.finditer(rf"<{tag}(\s[^>]*)?>.*?</{tag}>", text,
                                                   re.DOTALL | re.IGNORECASE)]
            if len(spans) >= 2:
                return spans
    marks = [m.start() for m in _NUMBERED.finditer(text)]
    if len(marks) >= 2:
        spans = []
        for i, s in enumerate(marks):
            if i + 1 < len(marks):
                e = marks[i + 1]
                while e > s and text[e - 1] in "\n \t":
                    e -= 1
            else:
                blank = text.find("\n\n", s)
                e = len(text) if blank < 0 else blank
            spans.append((s, e))
        return spans
    for d in delimiters:
        if d and text.count(d) >= 3:
            cuts = [m.start() for m in re.finditer(re.escape(d), text)]
            return [(a + len(d), b) for a, b in zip(cuts, cuts[1:], strict=False)]
    return []


class _Upstream:
    """The upstream transcript as one string with its text-unit boundaries."""

    def __init__(self, msgs: list[Msg], atoms: dict[tuple[object, ...], str]) -> None:
        parts: list[str] = []
        self.bounds: list[int] = []  # start offsets of text units and atoms
        size = 0
        for m in msgs:
            for u in m.units:
                self.bounds.append(size)
                s = u.text if isinstance(u, Text) else atoms.setdefault(
                    u.key, chr(_PUA + len(atoms) % 65000))
                parts.append(s)
                size += len(s)
        self.bounds.append(size)
        self.s = "".join(parts)
        self.words = None if not self.s else set(self.s.split())

    def same_unit(self, a: int, b: int) -> bool:
        """Whether offsets ``a`` < ``b`` fall inside one upstream unit."""
        return bisect_right(self.bounds, a) == bisect_right(self.bounds, b - 1)


@dataclass
class Allow:
    """What the applied passes allow to be missing (see module docstring)."""

    rag: bool = False
    history: bool = False
    hoist: bool = False
    delimiters: tuple[str, ...] = ()


def _leading_system(msgs: list[Msg]) -> int:
    n = 0
    while n < len(msgs) and msgs[n].role == "system":
        n += 1
    return n


def _numbers_as_values(v: object) -> object:
    """A canonical value (:func:`tests.fuzz.transcript.canon`) with each number as a float:
    equal for ``1.10`` / ``1.1`` and for an integer / its float rounding."""
    if isinstance(v, tuple):
        if len(v) == 2 and v[0] == "#" and isinstance(v[1], str):
            try:
                return ("#", float(v[1]))
            except ValueError:
                return v
        return tuple(_numbers_as_values(x) for x in v)
    return v


def _atom_violation(key: tuple[object, ...], atoms: dict[tuple[object, ...], str], role: str) -> Violation:
    """For a call that arrived with the same id and name but other arguments:
    ``call_number_text_changed`` when only number texts differ (re-serialisation), else
    ``call_args_changed``; otherwise ``<atom kind>_missing``."""
    if key[0] == "call":
        for other in atoms:
            if other[:3] == key[:3] and other != key:
                kind = ("call_number_text_changed" if _numbers_as_values(other[3]) == _numbers_as_values(key[3])
                        else "call_args_changed")
                return Violation(kind, f"{role} message: call {key[1]!r} sent "
                                 f"{key[3]!r:.120}, arrived {other[3]!r:.120}")
    return Violation(f"{key[0]}_missing", f"{role} message: {key!r:.160}")


Seg = tuple[object, bool, int, str]  # (text or atom key, optional, block, kind)


def _segments(m: Msg, allow: Allow) -> tuple[list[Seg], list[str]]:
    """``(segments, floating)``: each segment ``(text or atom key, optional, block, kind)``;
    ``floating``: passage texts (checked for presence only, never order)."""
    segs: list[Seg] = []
    floating: list[str] = []
    for u in m.units:
        if isinstance(u, Atom):
            segs.append((u.key, False, -1, "atom"))
            continue
        optional = (u.kind == "result" and (allow.history or allow.rag)) or (
            u.kind == "doc" and allow.rag)
        spans = passage_spans(u.text, allow.delimiters) if allow.rag and u.kind != "doc" else []
        last = 0
        for n, (a, b) in enumerate(spans):
            if u.text[last:a] and n == 0:  # separators between passages go with them
                segs.append((u.text[last:a], optional, u.block, u.kind))
            floating.append(u.text[a:b])
            last = b
        if u.text[last:]:
            segs.append((u.text[last:], optional, u.block, u.kind))
    return segs, floating


def _match_msg(up: _Upstream, atoms: dict[tuple[object, ...], str], m: Msg, allow: Allow,
               pos: int, out: list[Violation], strict: bool) -> int:
    """Match one client message from ``pos``; return the new cursor, or -1 when it fails.
    ``strict``: a message that must arrive (violations are appended); otherwise one pruning may
    drop (nothing is reported)."""
    segs, floating = _segments(m, allow)
    for p in floating if strict else []:
        if len(p) > 40 and p not in up.s and p[:40] in up.s:
            out.append(Violation("passage_cut", f"{m.role} message: passage {p[:60]!r} arrived in part"))
    prev: tuple[int, int, int] | None = None  # (block, start, end) of the previous text found whole
    for seg, optional, block, kind in segs:
        if kind == "atom":
            key = seg
            ch = atoms.get(key)  # type: ignore[arg-type]
            j = -1 if ch is None else up.s.find(ch, pos)
            if j < 0:
                if strict:
                    out.append(_atom_violation(key, atoms, m.role))  # type: ignore[arg-type]
                return -1
            pos, prev = j + 1, None
            continue
        assert isinstance(seg, str)
        j = up.s.find(seg, pos)
        if j < 0 and kind == "doc":
            # a document's title / context carried as a <document ...> attribute arrives as a
            # JSON string (bridge_fields.open_tag: quotes and control characters escaped, so
            # the delimiter cannot be forged); the escaped form is the same text
            esc = json.dumps(seg, ensure_ascii=False)[1:-1]
            j = up.s.find(esc, pos) if esc != seg else -1
            seg = esc if j >= 0 else seg
        if j >= 0:
            if prev and prev[0] != block and prev[2] == j and up.same_unit(prev[1], j + len(seg)) \
                    and strict:
                out.append(Violation("glued_blocks", f"{m.role} message: blocks {prev[0]} and {block}"
                                     f" joined without a separator: ...{up.s[max(0, j - 20):j + 20]!r}"))
            pos, prev = j + len(seg), (block, j, j + len(seg))
            continue
        if optional:
            continue
        if strict:
            out.append(Violation("text_missing_or_moved", f"{m.role} message ({kind}): "
                                 f"{seg[:80]!r} (len {len(seg)})"))
        return -1
    return pos


def meaning_violations(client: list[Msg], upstream: list[Msg], allow: Allow) -> list[Violation]:
    """Every way ``upstream`` fails to carry ``client`` (see module docstring)."""
    atoms: dict[tuple[object, ...], str] = {}
    up = _Upstream(upstream, atoms)
    out: list[Violation] = []
    lead = _leading_system(client)
    for m in client[:lead]:
        m.top = True  # OpenAI's leading system messages are its system prompt
    first_user = next((i for i, m in enumerate(client) if m.role == "user"), -1)
    pos = 0
    for i, m in enumerate(client):
        if allow.hoist and i < lead:
            words = {w for u in m.units if isinstance(u, Text) for w in u.text.split()}
            lost = sorted(w for w in words if w not in up.s)
            if lost:
                out.append(Violation("system_text_lost", f"words {lost[:5]!r}"))
            continue
        skippable = allow.history and i != first_user and not m.top
        found: list[Violation] = []
        end = _match_msg(up, atoms, m, allow, pos, found, strict=not skippable)
        if end >= 0:
            pos = end
        elif i == first_user and allow.history:
            found = [Violation("first_user_turn_lost", "history pruning dropped the first user "
                               "message (the task)")]
        out.extend(found)
    return out
