"""Learned volatility: spans of the system text seen changing between requests of a session.

Detectors (``volatile_spans``) only know clocks and ids. Anything else that changes on every
request — a live counter, a rotating tip, a per-request summary line — is found by comparing
the system text with the previous request's, without keeping that text: the session memory holds
a 48-bit digest per line (:func:`line_digest`), and for long lines (over
:data:`WORD_DIFF_MIN_CHARS`) an 8-hex hash per whitespace-separated word (crc32).

* A line that changed in place (``difflib`` "replace" over the line hashes; a line whose exact text
  the previous request had elsewhere moved, e.g. a re-ranked passage, and is not learned) becomes a
  learned entry ``[anchor, offset]``: ``anchor`` is the hash of the nearest *unique* unchanged line
  before it (``"^"`` for the start of the text) and ``offset`` the distance to it, so the entry
  finds its line again on later requests even when the line's own text (hence hash) changes.
* In a long line, the changed words (common word prefix ``p`` and suffix ``q`` removed) become
  ``[anchor, offset, p, q]``: the span from word ``p`` to the ``q``-th word from the end.
* More than :data:`MAX_CHANGED_LINES` (or a quarter) of lines changed means a new prompt, not a
  volatile span: nothing is learned.

Entries are sticky (kept while their anchor exists, at most :data:`MAX_LEARNED`), so a value that
happens not to change on one request keeps its place at the end instead of flapping back.

Bounded memory and work (issue 8, class 2): only the first :data:`MAX_TRACKED_LINES` lines of the
system text are tracked (a change near the top costs the most cache: everything after it), their
digests packed into ONE string of 8 base64 characters per line (:func:`pack`), and at most
:data:`MAX_WORD_HASHES` word hashes in all, packed per line (8 hex each). A session's memory is
then at most ~4 KB whatever the prompt's size (the old list of one string per line took ~8 MB
for a 1 MB prompt), and hashing and diffing cost at most that many lines per request.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import Any

MAX_LEARNED = 32
MAX_CHANGED_LINES = 4
MAX_WHOLE_LINE_CHARS = 600
WORD_DIFF_MIN_CHARS = 200
MAX_WORD_HASHES = 256
MAX_TRACKED_LINES = 256
LINE_DIGEST_CHARS = 8
"""A line's digest: 48 bits of sha256 in url-safe base64 (8 characters, fixed width).
Collisions among 256 tracked lines: about 1 in 10^10."""
WORD_HEX = 8
_WORD = re.compile(r"\S{1,256}")
"""A word: a run of non-space characters (a longer run counts as several words; bounded so
every scan here is linear)."""


def h16(text: str) -> str:
    """16-hex sha256 of a text (tool definitions)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def line_digest(text: str) -> str:
    """:data:`LINE_DIGEST_CHARS`-character digest of a line (48 bits of sha256, base64)."""
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:6]).decode()


def _h8(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


@dataclass(frozen=True)
class Line:
    """Line ``texts[block][start:end]`` (newline excluded)."""

    block: int
    start: int
    end: int


def split_lines(texts: list[str] | tuple[str, ...], limit: int = MAX_TRACKED_LINES) -> list[Line]:
    """The first ``limit`` lines of the text blocks, in order (``str.find``: the rest of a huge
    prompt is never split)."""
    out: list[Line] = []
    for bi, t in enumerate(texts):
        pos = 0
        while len(out) < limit:
            nl = t.find("\n", pos)
            end = len(t) if nl < 0 else nl
            out.append(Line(bi, pos, end))
            if nl < 0:
                break
            pos = nl + 1
        if len(out) >= limit:
            break
    return out


def pack(hashes: list[str]) -> str:
    """Fixed-width hex hashes joined into one string (one object, not one per line)."""
    return "".join(hashes)


def unpack(packed: Any, width: int) -> list[str]:
    """:func:`pack`'s inverse; also accepts the older list form. Anything else: ``[]``."""
    if isinstance(packed, list):
        return [x for x in packed if isinstance(x, str)]
    if not isinstance(packed, str) or len(packed) % width:
        return []
    return [packed[i:i + width] for i in range(0, len(packed), width)]


def line_hashes(texts: list[str]) -> list[str]:
    """:func:`line_digest` of each tracked line of ``texts`` (the first
    :data:`MAX_TRACKED_LINES`)."""
    return [line_digest(texts[ln.block][ln.start:ln.end]) for ln in split_lines(texts)]


def word_hashes(texts: list[str]) -> dict[str, list[str]]:
    """``{line index: [8-hex crc32 word hashes]}`` for long tracked lines (at most
    :data:`MAX_WORD_HASHES` in all)."""
    out: dict[str, list[str]] = {}
    total = 0
    for j, ln in enumerate(split_lines(texts)):
        if ln.end - ln.start < WORD_DIFF_MIN_CHARS:
            continue
        text = texts[ln.block][ln.start:ln.end]
        words = [_h8(m.group()) for m in _WORD.finditer(text)]
        if total + len(words) > MAX_WORD_HASHES:
            break
        total += len(words)
        out[str(j)] = words
    return out


def packed_memory(texts: list[str]) -> tuple[str, dict[str, str]]:
    """``(lines, words)`` as stored in session memory: :func:`line_hashes` and
    :func:`word_hashes` packed (at most ~4 KB)."""
    return pack(line_hashes(texts)), {k: pack(v) for k, v in word_hashes(texts).items()}


def _anchor(cur: list[str], counts: dict[str, int], j1: int) -> tuple[str, int]:
    base = j1 - 1
    while base >= 0 and counts[cur[base]] != 1:
        base -= 1
    return ("^" if base < 0 else cur[base]), base


def learn(prev: list[str], cur: list[str], prev_words: dict[str, list[str]],
          cur_words: dict[str, list[str]]) -> list[list[Any]]:
    """New learned entries from the lines that changed in place (see module docstring)."""
    entries: list[list[Any]] = []
    counts: dict[str, int] = {}
    for x in cur:
        counts[x] = counts.get(x, 0) + 1
    before = set(prev)
    sm = difflib.SequenceMatcher(None, prev, cur, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op != "replace":
            continue
        anchor, base = _anchor(cur, counts, j1)
        for k, j in enumerate(range(j1, j2)):
            i = i1 + k
            if cur[j] in before:  # the previous request had this very line: it moved (a
                continue          # re-ranked passage), it did not change
            pw, cw = prev_words.get(str(i)), cur_words.get(str(j))
            if i < i2 and pw and cw:
                p = 0
                while p < min(len(pw), len(cw)) and pw[p] == cw[p]:
                    p += 1
                q = 0
                while q < min(len(pw), len(cw)) - p and pw[-1 - q] == cw[-1 - q]:
                    q += 1
                if p + q < len(cw) and (len(cw) - p - q) * 2 <= len(cw):
                    entries.append([anchor, j - base, p, q])
                    continue
            entries.append([anchor, j - base])
    return entries


@dataclass(frozen=True)
class Range:
    """Where a learned entry lands in the current text: ``texts[block][start:end]``;
    ``whole_line``: the entry is a whole line (not a word range in a long line)."""

    block: int
    start: int
    end: int
    whole_line: bool


def learned_ranges(texts: list[str], learned: list[list[Any]]) -> list[Range]:
    """Where each learned entry lands in ``texts`` (entries whose anchor is gone, or whose
    word range no longer fits its line, land nowhere): a whole line with its leading and
    trailing whitespace trimmed, or the words ``p`` .. ``-q-1`` of a long line."""
    lines = split_lines(texts)
    hashes = [line_digest(texts[ln.block][ln.start:ln.end]) for ln in lines]
    first: dict[str, int] = {}
    for i, h in enumerate(hashes):
        first.setdefault(h, i)
    out: list[Range] = []
    for entry in learned:
        anchor, off = entry[0], int(entry[1])
        base = -1 if anchor == "^" else first.get(anchor)
        if base is None or not 0 <= base + off < len(lines):
            continue
        ln = lines[base + off]
        text = texts[ln.block][ln.start:ln.end]
        if len(entry) == 4:
            words = list(_WORD.finditer(text))
            a, b = int(entry[2]), len(words) - int(entry[3]) - 1
            if not 0 <= a <= b < len(words):
                continue
            out.append(Range(ln.block, ln.start + words[a].start(), ln.start + words[b].end(), False))
        else:
            lead = len(text) - len(text.lstrip())
            s, e = ln.start + lead, ln.start + len(text.rstrip())
            if e > s:
                out.append(Range(ln.block, s, e, True))
    return out
