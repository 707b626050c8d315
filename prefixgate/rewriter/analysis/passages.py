"""Find retrieved passages (RAG chunks) in text, so a pass can keep the relevant ones whole.

Recognised forms (first match wins, per text):

1. XML-like tagged chunks — ``<document ...>...</document>``, ``<doc>``, ``<passage>``,
   ``<ctx id=...>``, ``<chunk>``, ``<source>``, ``<search_result>``, ``<context>``,
   ``<result>``, ``<snippet>``: the tag that occurs at least twice as a closed element. Anthropic's
   long-context guide recommends ``<document index="n"><source>..</source>
   <document_content>..</document_content></document>``; the inner tags are part of the passage.
2. Numbered passages — lines starting ``[1]``, ``[2]``, ... (at least two, increasing); each runs
   to the next marker, the last one to the next blank line or the end of the text.
3. Delimiters named by the policy (``settings.rag_delimiters``, e.g. ``"\\n---\\n"``): the
   segments strictly between the first and the last delimiter are passages.

A passage's ``pid`` is its ``id`` / ``index`` / ``doc_id`` / ``key`` / ``name`` attribute, its
``[n]`` number, or (no id) a 12-hex sha256 of its text. Anthropic ``document`` and
``search_result`` blocks are recognised by :func:`block_passage`.

Where the text came from decides which forms count (issue 8, class 3). Text that is retrieved by
construction (a tool result) is searched in all three forms. Text a user wrote is searched only
for markup a retrieval layer injects (``retrieved=False``: :data:`RETRIEVAL_TAGS`): a user's own
numbered list, ``---``-separated sections or ``<result>`` notes are the user's content, never
passages.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

PASSAGE_TAGS: tuple[str, ...] = (
    "document", "doc", "passage", "ctx", "chunk", "search_result", "source", "context",
    "result", "snippet", "article", "reference",
)
RETRIEVAL_TAGS: tuple[str, ...] = (
    "document", "search_result", "passage", "chunk", "ctx", "doc", "snippet",
)
"""Tags that mark injected retrieval in a user's own message: the ones RAG frameworks and
Anthropic's long-context guide wrap retrieved chunks in. Generic words (``result``, ``source``,
``context``, ``reference``, ``article``) are not among them."""
_ATTR = re.compile(
    r"""([A-Za-z_][\w-]{0,63})\s{0,8}=\s{0,8}(?:"([^"]{0,256})"|'([^']{0,256})'|([^\s>]{1,256}))""")
_ID_ATTRS = ("id", "index", "doc_id", "docid", "key", "idx", "name")
_NUMBERED = re.compile(r"(?m)^[ \t]{0,16}\[(\d{1,4})\][ \t]?")
_OPEN = {tag: re.compile(rf"<{tag}(\s[^>]{{0,255}})?>", re.IGNORECASE) for tag in PASSAGE_TAGS}
_CLOSE = {tag: re.compile(rf"</{tag}>", re.IGNORECASE) for tag in PASSAGE_TAGS}
_ANY_OPEN = re.compile(r"<([A-Za-z][\w.:-]{0,63})(\s[^<>]{0,255})?>")
_ANY_CLOSE = re.compile(r"</([A-Za-z][\w.:-]{0,63})>")
"""Any element's opening / closing tag (tag names outside :data:`PASSAGE_TAGS`, filtered by
name in :func:`element_pairs`: one scan each, no pattern built per name)."""
_INNER_TAG = re.compile(r"<[^>]{1,80}>")
"""Every quantifier bounded (attributes at most 255 characters): each scan is linear."""


@dataclass(frozen=True)
class Passage:
    """One passage inside a text: ``text[start:end]`` is the whole chunk (tags included).

    ``pid``: stable id (see module docstring); ``kind``: ``"tag:<name>"``, ``"numbered"`` or
    ``"delimited"``; ``body``: the chunk's content for scoring (tags stripped).
    """

    pid: str
    start: int
    end: int
    kind: str
    body: str


def content_id(text: str) -> str:
    """12-hex sha256 of whitespace-normalised text: the id of a passage that carries none."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:12]


def attributes(attrs: str) -> dict[str, str]:
    """``{name (lower case): value}`` of an opening tag's attribute text."""
    return {m.group(1).lower(): next(g for g in m.groups()[1:] if g is not None)
            for m in _ATTR.finditer(attrs)}


def _attr_id(attrs: str) -> str | None:
    found = attributes(attrs)
    for key in _ID_ATTRS:
        if found.get(key):
            return found[key]
    return None


@dataclass(frozen=True)
class Element:
    """One closed element: ``text[start:end]``; its opening tag ends at ``open_end``, its body
    ``text[open_end:body_end]``; ``attrs``: the opening tag's attribute text."""

    start: int
    open_end: int
    attrs: str
    body_end: int
    end: int


def element_pairs(text: str, tag: str) -> list[Element]:
    """Every closed element ``tag`` (any tag name, case-insensitive), paired as a lazy
    ``<tag ...>(.*?)</tag>`` scan would pair them (an opening takes the first closing after it;
    openings inside a body are part of it), in one sweep over openings and closings: linear,
    where the lazy regex re-scanned to the end of the text from every unclosed opening."""
    if tag in _OPEN:
        opens = [(m.start(), m.end(), m.group(1) or "") for m in _OPEN[tag].finditer(text)]
        closing: Iterator[re.Match[str]] = _CLOSE[tag].finditer(text)
    else:
        name = tag.lower()
        opens = [(m.start(), m.end(), m.group(2) or "") for m in _ANY_OPEN.finditer(text)
                 if m.group(1).lower() == name]
        closing = (m for m in _ANY_CLOSE.finditer(text) if m.group(1).lower() == name)
    closes = [(m.start(), m.end()) for m in closing]
    out: list[Element] = []
    ci, pos = 0, 0
    for start, open_end, attrs in opens:
        if start < pos:
            continue
        while ci < len(closes) and closes[ci][0] < open_end:
            ci += 1
        if ci == len(closes):
            break
        out.append(Element(start, open_end, attrs, closes[ci][0], closes[ci][1]))
        pos = closes[ci][1]
        ci += 1
    return out


def _tagged(text: str, tags: Sequence[str] = PASSAGE_TAGS) -> list[Passage]:
    lowered = text.lower()
    for tag in tags:
        if lowered.count(f"</{tag}>") < 2:
            continue
        found = []
        for el in element_pairs(text, tag):
            body = text[el.open_end:el.body_end]
            found.append(Passage(_attr_id(el.attrs) or content_id(body), el.start, el.end,
                                 f"tag:{tag}", _INNER_TAG.sub(" ", body)))
        if len(found) >= 2:
            return found
    return []


def tagged_passages(text: str, tags: Sequence[str] = PASSAGE_TAGS) -> list[Passage]:
    """Closed elements of the first of ``tags`` that occurs at least twice (form 1 of the
    module docstring); ``[]`` when fewer than two are found."""
    return _tagged(text, tags)


def _numbered(text: str) -> list[Passage]:
    marks = list(_NUMBERED.finditer(text))
    if len(marks) < 2:
        return []
    nums = [int(m.group(1)) for m in marks]
    if any(b <= a for a, b in pairwise(nums)):
        return []
    out = []
    for i, m in enumerate(marks):
        if i + 1 < len(marks):
            end = marks[i + 1].start()
            while end > m.end() and text[end - 1] in "\n \t":
                end -= 1
        else:
            blank = text.find("\n\n", m.end())
            end = len(text) if blank < 0 else blank
        out.append(Passage(m.group(1), m.start(), end, "numbered", text[m.end():end]))
    return out


def _delimited(text: str, delimiters: Sequence[str]) -> list[Passage]:
    for delim in delimiters:
        if not delim or text.count(delim) < 3:
            continue
        cuts = _occurrences(text, delim)
        out = []
        for a, b in pairwise(cuts):
            s, e = a + len(delim), b
            body = text[s:e]
            if body.strip():
                out.append(Passage(content_id(body), s, e, "delimited", body))
        if len(out) >= 2:
            return out
    return []


def _occurrences(text: str, delim: str) -> list[int]:
    """Start of every non-overlapping occurrence of ``delim``, left to right (``str.find``)."""
    out: list[int] = []
    i = text.find(delim)
    while i >= 0:
        out.append(i)
        i = text.find(delim, i + len(delim))
    return out


def find_passages(text: str, delimiters: Sequence[str] = (), *,
                  retrieved: bool = True) -> list[Passage]:
    """Passages in ``text`` in text order (``[]`` when fewer than two are found).

    ``retrieved=True`` (a tool result's text): tagged chunks, numbered ``[n]`` passages, policy
    delimiters, tried in that order. ``retrieved=False`` (a user's own message): only chunks
    tagged with one of :data:`RETRIEVAL_TAGS` (module docstring).
    """
    if not retrieved:
        return _tagged(text, RETRIEVAL_TAGS)
    for found in (_tagged(text), _numbered(text), _delimited(text, delimiters)):
        if len(found) >= 2:
            return found
    return []


def splice(text: str, passages: Sequence[Passage], kept: Sequence[Passage],
           delimiters: Sequence[str] = ()) -> str:
    """Rebuild ``text`` with only ``kept`` passages; never removes a character outside them.

    ``passages`` (all found, text order) define slots; ``kept`` must be a subset. When the text
    between consecutive passages is only structure (whitespace, or one of ``delimiters``), the
    first ``len(kept)`` slots receive the kept passages in ``kept``'s order (canonical order),
    the separators between kept slots are kept and the rest of the slots and separators go.
    When any text between passages is content (a user's words between two retrieved chunks),
    dropped passages are cut out in place: every gap stays where it was and kept passages keep
    their text order (issue 8, class 3). Text before the first and after the last passage
    stays as is (only whitespace at the seam is trimmed when nothing is kept).
    """
    if not passages:
        return text
    head, tail = text[: passages[0].start], text[passages[-1].end :]
    gaps = [text[a.end : b.start] for a, b in pairwise(passages)]
    marks = {d.strip() for d in delimiters if d.strip()}
    if any(g.strip() and g.strip() not in marks for g in gaps):
        keep = set(kept)
        parts = [head]
        for i, p in enumerate(passages):
            if i:
                parts.append(gaps[i - 1])
            if p in keep:
                parts.append(text[p.start : p.end])
        parts.append(tail)
        return "".join(parts)
    if not kept:
        return head.rstrip() + ("\n" + tail.lstrip() if tail.strip() else tail)
    parts = [head]
    for i, p in enumerate(kept):
        if i:
            parts.append(gaps[i - 1])
        parts.append(text[p.start : p.end])
    parts.append(tail)
    return "".join(parts)


def id_order_key(pid: str) -> tuple[int, int, str]:
    """Canonical order of passage ids: numeric ids numerically first, then the rest by string."""
    return (0, int(pid), "") if pid.isdigit() else (1, 0, pid)


def block_passage(block: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(pid, text)`` of an Anthropic ``document`` (text or content source) or
    ``search_result`` block; ``None`` for any other block (or a PDF/base64 document, whose text
    is unknown). ``pid`` is a content hash of ``title`` + ``source`` + text."""
    btype = block.get("type")
    if btype == "search_result":
        content = block.get("content")
        text = "".join(c.get("text", "") for c in content if isinstance(c, Mapping)) \
            if isinstance(content, list) else ""
        title, src = str(block.get("title", "")), str(block.get("source", ""))
    elif btype == "document":
        source = block.get("source")
        if not isinstance(source, Mapping):
            return None
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            text = str(source["data"])
        elif source.get("type") == "content" and isinstance(source.get("content"), list):
            text = "".join(c.get("text", "") for c in source["content"] if isinstance(c, Mapping))
        else:
            return None
        title, src = str(block.get("title", "")), str(block.get("context", ""))
    else:
        return None
    return content_id(f"{title}\n{src}\n{text}"), f"{title}\n{text}"


def citations_enabled(block: Mapping[str, Any]) -> bool:
    """True when an Anthropic document / search_result block asks for citations: responses then
    cite it by position (``document_index`` / ``search_result_index``), so it must not move."""
    c = block.get("citations")
    return isinstance(c, Mapping) and bool(c.get("enabled"))
