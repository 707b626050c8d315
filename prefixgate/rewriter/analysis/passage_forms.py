"""Find a *retrieval* (a run of injected passages) in one text, in every markup form RAG and
memory layers use, for :mod:`prefixgate.rewriter.passes.stabilise_passages`.

Forms, tried in this order (the first that yields at least two passages wins):

1. XML-like tagged elements (``<document id=..>``, ``<passage>``, ``<search_result>`` ...):
   :func:`prefixgate.rewriter.analysis.passages.find_passages`' tag scan.
2. ``Document N:`` headers — a line starting ``Document`` / ``Doc`` / ``Passage`` / ``Source`` /
   ``Chunk`` / ``Snippet`` / ``Search result`` followed by a label and ``:`` (or ``-``, ``|``).
3. Markdown sections whose headings (all of one level) start with one of those words.
4. A JSON array of at least two objects that each carry a text field (``content``, ``text``,
   ``page_content``, ``body``, ``snippet``, ``chunk``, ``passage``, ``document``).
5. ``[n]`` numbered passages (distinct numbers, any order).
6. By structure (issue 19, item 7), whatever the tag name: a run of at least two sibling
   elements of one shape — one tag name, the same attribute names, only whitespace between
   them — each with a label attribute (:data:`LABEL_ATTRS`), the labels distinct
   (``<kb_article id="a" title=..>``, ``<memory key=..>``): :func:`sibling_elements`.

A passage is the whole element, header or list item: its label (id, number, heading) travels
with it, so a citation ``[7]`` still names the same passage after a reorder. Only the passages
move; the text between them must be structure (whitespace, or ``,`` between JSON elements).

Where the text came from decides what counts (docs/passes.md, "retrieval-only"):

* ``origin="tool"`` (a tool result: retrieved by construction): every form, every tag of
  :data:`prefixgate.rewriter.analysis.passages.PASSAGE_TAGS`.
* ``origin="system"`` (text the application wrote, where RAG layers inject context): tags of
  :data:`prefixgate.rewriter.analysis.passages.RETRIEVAL_TAGS` (a developer's ``<example>``, ``<result>`` or
  ``<context>`` blocks without labels are instructions, not passages), forms 2-4 and 6; ``[n]``
  lists only under a retrieval header line (``Sources:``, ``Search results:``, ...).
* ``origin="user"`` (a user's own message): tags of
:data:`prefixgate.rewriter.analysis.passages.RETRIEVAL_TAGS`;
  every other form only directly under a retrieval header line (:data:`RETRIEVAL_HEADER`) — a
  user's own numbered list, ``Document 1:`` notes, markdown sections or labelled elements are
  the user's content.

A group whose extent is ambiguous (a multi-paragraph passage before the last one, so the last
one's end cannot be told from the text after it) is not a retrieval: ``[]``. Every scan is
linear (bounded quantifiers; at most :data:`MAX_JSON_TRIES` JSON parses per text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Literal

from prefixgate.rewriter.analysis.passages import (
    PASSAGE_TAGS,
    RETRIEVAL_TAGS,
    Passage,
    attributes,
    content_id,
    element_pairs,
    tagged_passages,
)

Origin = Literal["tool", "system", "user"]

_WORDS = r"document|doc|passage|source|chunk|snippet|search[ \t]result"
_DOC_HEADER = re.compile(
    rf"(?im)^[ \t]{{0,8}}(?:\*\*)?(?:{_WORDS})[ \t]{{0,4}}(?:#|no\.)?[ \t]{{0,4}}"
    r"\[?([A-Za-z0-9_.\-]{1,40})\]?[ \t]{0,4}(?:\*\*)?[ \t]{0,4}[:|\-]")
_MD_HEADER = re.compile(
    rf"(?im)^(#{{1,6}})[ \t]{{1,8}}(?:{_WORDS})\b[^\n]{{0,200}}$")
_NUMBERED = re.compile(r"(?m)^[ \t]{0,16}\[(\d{1,4})\]")
_JSON_START = re.compile(r"\[\s{0,64}\{")
RETRIEVAL_HEADER = re.compile(
    r"(?i)\b(?:search[ \t]results?|sources|references|retrieved|retrieval|context|documents|"
    r"passages|knowledge[ \t]base|snippets|citations|relevant[ \t]\w{1,20})\b[^\n]{0,80}:[ \t]{0,8}$")
"""The line right above a user's (or an ``[n]`` list's) passages that marks them as injected:
it names retrieval (``Sources:``, ``Search results:``, ``Use the following context:``) and ends
with a colon."""
LABEL_ATTRS = ("id", "index", "doc_id", "docid", "key", "idx", "name", "title", "source", "url",
               "path", "ref", "uri")
"""Attributes that label an element (form 6): the first one present is its label."""
_ANY_OPEN = re.compile(r"<([A-Za-z][\w.:-]{0,63})\s[^<>]{0,255}>")
MAX_TAG_NAMES = 16
"""Distinct tag names (with attributes) tried by :func:`sibling_elements`, in order of first
appearance: each costs one linear scan."""
TEXT_KEYS = ("content", "text", "page_content", "body", "snippet", "chunk", "passage", "document")
MAX_JSON_TRIES = 8


def _header_above(text: str, start: int) -> bool:
    """True when the last non-blank line before ``start`` is a retrieval header."""
    before = text[:start].rstrip()
    if before.endswith("["):  # a JSON array's opening bracket on its own line
        before = before[:-1].rstrip()
    line = before[before.rfind("\n") + 1:]
    return bool(RETRIEVAL_HEADER.search(line[-200:]))


def _line_end(text: str, pos: int) -> int:
    nl = text.find("\n", pos)
    return len(text) if nl < 0 else nl


def _by_headers(text: str, starts: Sequence[int], labels: Sequence[str], kind: str,
                body_below: bool = False) -> list[Passage]:
    """Passages that run from each header to the next; the last to its first blank line (after
    the blank lines under its heading when ``body_below``, markdown). ``[]`` when ambiguous
    (module docstring) or labels repeat."""
    if len(starts) < 2 or len(set(labels)) != len(labels):
        return []
    out: list[Passage] = []
    for i, s in enumerate(starts):
        body_from = _line_end(text, s)
        if i + 1 < len(starts):
            end = starts[i + 1]
            while end > s and text[end - 1] in "\n \t":
                end -= 1
            if "\n\n" in text[body_from:end].strip("\n \t"):
                return []
        else:
            pos = body_from
            while body_below and pos < len(text) and text[pos] in "\n \t":
                pos += 1
            blank = text.find("\n\n", pos)
            end = len(text) if blank < 0 else blank
        out.append(Passage(labels[i], s, end, kind, text[s:end]))
    return out


def doc_headers(text: str) -> list[Passage]:
    """``Document N:``-style passages (form 2)."""
    marks = list(_DOC_HEADER.finditer(text))
    return _by_headers(text, [m.start() for m in marks], [m.group(1) for m in marks], "header")


def markdown_sections(text: str) -> list[Passage]:
    """Markdown sections with retrieval headings, all of the first heading's level (form 3)."""
    marks = list(_MD_HEADER.finditer(text))
    if not marks:
        return []
    level = marks[0].group(1)
    if any(m.group(1) != level for m in marks):
        return []
    return _by_headers(text, [m.start() for m in marks],
                       [m.group(0).strip() for m in marks], "markdown", body_below=True)


def numbered(text: str) -> list[Passage]:
    """``[n]`` passages, distinct numbers in any order (form 5)."""
    marks = list(_NUMBERED.finditer(text))
    return _by_headers(text, [m.start() for m in marks], [m.group(1) for m in marks], "numbered")


def _json_elements(text: str, at: int) -> list[Passage]:
    """Elements of the JSON array starting at ``text[at] == "["`` when it is a document list."""
    dec = json.JSONDecoder()
    pos, out = at + 1, []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        try:
            obj, end = dec.raw_decode(text, pos)
        except ValueError:
            return []
        if not isinstance(obj, dict) or not any(isinstance(obj.get(k), str) for k in TEXT_KEYS):
            return []
        out.append(Passage(content_id(text[pos:end]), pos, end, "json", text[pos:end]))
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
            continue
        return out if pos < len(text) and text[pos] == "]" and len(out) >= 2 else []


def json_documents(text: str) -> list[Passage]:
    """The first JSON array of document objects in ``text`` (form 4)."""
    for n, m in enumerate(_JSON_START.finditer(text)):
        if n >= MAX_JSON_TRIES:
            break
        found = _json_elements(text, m.start())
        if found:
            return found
    return []


def _label(attrs: dict[str, str]) -> str | None:
    return next((attrs[k] for k in LABEL_ATTRS if attrs.get(k)), None)


def _sibling_run(text: str, tag: str) -> list[Passage]:
    """The first run of 2+ elements ``tag`` of one shape with distinct labels (form 6)."""
    run: list[Passage] = []
    labels: set[str] = set()
    shape: tuple[str, ...] = ()
    for el in element_pairs(text, tag):
        attrs = attributes(el.attrs)
        label, keys = _label(attrs), tuple(sorted(attrs))
        here = Passage(label or "", el.start, el.end, f"element:{tag}", text[el.open_end:el.body_end])
        if label is not None and run and keys == shape and label not in labels \
                and not text[run[-1].end:el.start].strip():
            run.append(here)
            labels.add(label)
            continue
        if len(run) >= 2:
            return run
        run, labels, shape = ([here], {label}, keys) if label is not None else ([], set(), keys)
    return run if len(run) >= 2 else []


def sibling_elements(text: str) -> list[Passage]:
    """Labelled sibling elements of one shape, whatever their tag name (form 6): the first
    tag name (of the first :data:`MAX_TAG_NAMES` with attributes) that has such a run."""
    names: list[str] = []
    for m in _ANY_OPEN.finditer(text):
        name = m.group(1)
        if name not in names:
            names.append(name)
            if len(names) == MAX_TAG_NAMES:
                break
    lowered = text.lower()
    for name in names:
        if lowered.count(f"</{name.lower()}>") >= 2:
            found = _sibling_run(text, name)
            if found:
                return found
    return []


def structural_gaps(text: str, passages: Sequence[Passage]) -> bool:
    """True when only whitespace (or one ``,`` for JSON elements) lies between passages."""
    for a, b in pairwise(passages):
        gap = text[a.end:b.start].strip()
        if gap and not (a.kind == "json" and gap == ","):
            return False
    return True


def find_retrieval(text: str, origin: Origin) -> list[Passage]:
    """The retrieval in ``text`` (module docstring), passages in text order; ``[]`` if none."""
    tags = PASSAGE_TAGS if origin == "tool" else RETRIEVAL_TAGS
    found = tagged_passages(text, tags)
    if len(found) >= 2 and structural_gaps(text, found):
        return found
    for finder, header_needed in ((doc_headers, origin == "user"),
                                  (markdown_sections, origin == "user"),
                                  (json_documents, origin == "user"),
                                  (numbered, origin != "tool"),
                                  (sibling_elements, origin == "user")):
        found = finder(text)
        if len(found) < 2 or not structural_gaps(text, found):
            continue
        if header_needed and not _header_above(text, found[0].start):
            continue
        return found
    return []


def reorder(text: str, passages: Sequence[Passage], order: Sequence[int]) -> str:
    """``text`` with ``passages`` (text order, structural gaps) emitted in ``order`` (indices, a
    permutation): slot ``k`` receives passage ``order[k]``; every gap, the head and the tail
    stay where they are, so the text keeps every character."""
    head, tail = text[: passages[0].start], text[passages[-1].end:]
    parts = [head]
    for k, i in enumerate(order):
        if k:
            parts.append(text[passages[k - 1].end: passages[k].start])
        p = passages[i]
        parts.append(text[p.start: p.end])
    parts.append(tail)
    return "".join(parts)
