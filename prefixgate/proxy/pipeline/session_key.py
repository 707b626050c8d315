"""The automatic session id: one agent conversation is one session, whatever ids it carries.

Rule (issue 19, item 4). Without the client's ``x-prefixgate-session`` header the id is
``"auto-" + h(h(key) | h(system') | h(first_user'))`` with ``h`` = sha256, 16 hex digits, where

- ``key`` is the ``authorization`` / ``x-api-key`` header (hashed, never stored), so two users'
  identical conversations are two sessions;
- ``system`` is the first system text: Anthropic's top-level ``system``, the Responses API's
  ``instructions``, else the first ``system`` / ``developer`` message; ``first_user`` is the first
  user message (Chat / Messages ``messages``, Responses ``input``); text parts only;
- ``'`` is the text **with every span the volatile detectors recognise replaced by one mask
  character**: the passes' detector (:data:`prefixgate.rewriter.analysis.volatile_spans.DETECTORS`: clock
  readings, ISO / RFC 2822 / long date-times, epochs, UUIDs, labelled ids) and the cache room's
  (:data:`prefixgate.cache.savings.break_spans.IDENTITY_PATTERNS`: dates, times, unix timestamps, hex
  ids, ``req_…`` ids, base64 ids, counters such as ``turn 7``). The system text then has every
  digit masked too (a clock, request number or version the detectors do not name; the rule of
  case B03). The first user message keeps its other digits: "what is 2+2" and "what is 3+3" are
  two conversations.

A request id, a clock or a turn counter in the system prompt or the first user message therefore
leaves the session as it was (the issue's 13-turn loop whose system prompt held a request UUID
was 13 sessions). Every volatile span holds a digit (a UUID its version digit; a date in words
alone, "Monday, March", is left: it changes once a day), so only lines with a digit are
scanned; a span never crosses a newline here (lines are scanned one by one).

Bounded: at most :data:`SESSION_TEXT_CHARS` characters of each text; when a text is longer, its
last, cut line is left out (the cut moves with the length of the spans before it). Fast: the
digest of a masked line is memoized by the line's hash (:data:`MEMO_LINES` entries, then the
memo starts over; no text kept), so the lines of a system prompt are scanned once however many
requests and conversations carry them, and a new request costs one ``str.translate``, two splits,
a substring test per line and a hash + memo lookup per line that holds a digit
(``bench/session_key_cost.py``: a 64 KB system prompt, measured per call). An agent resends
the same system text and first user message every turn, so the id itself is memoized too, by
the hash of ``(key, system, first_user)`` (:data:`MEMO_IDS` entries, then started over; no text
kept): a turn after the first costs the texts' hashes (issue 25: ~50 us a turn on a 29 KB
tau-bench body before).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from prefixgate.cache.savings import break_spans as cache_spans
from prefixgate.rewriter.analysis import volatile_spans as pass_spans

SESSION_HEADER = "x-prefixgate-session"
SESSION_TEXT_CHARS = 1 << 16
"""Characters of the system text / first user message that identify a session: enough to tell
conversations apart, and the loop never hashes megabytes for it."""
MASK = "\x00"
"""What one volatile span (or a run of overlapping ones) becomes in the hashed text."""
MEMO_LINES = 1 << 16
"""Masked-line digests kept per memo (about 10 MB at most); past it the memo is cleared and
refilled by the next requests."""
MEMO_IDS = 1 << 14
"""Session ids kept by :func:`session_id_for`'s memo (about 2 MB at most), then cleared."""

PATTERNS: tuple[re.Pattern[str], ...] = (
    tuple(rx for _, rx in pass_spans.DETECTORS)
    + tuple(rx for _, rx in cache_spans.IDENTITY_PATTERNS))
"""Every pattern whose spans the key ignores; a pattern with a group ``v`` masks that group."""

_DIGITS = str.maketrans("123456789", "000000000")


def _h(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def mask_line(line: str) -> str:
    """``line`` with each union of overlapping volatile spans replaced by :data:`MASK`."""
    spans: list[tuple[int, int]] = []
    for rx in PATTERNS:
        group = "v" if "v" in rx.groupindex else 0
        for m in rx.finditer(line):
            s, e = m.span(group)
            if e > s:
                spans.append((s, e))
    if not spans:
        return line
    spans.sort()
    out: list[str] = []
    pos, cur_s, cur_e = 0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s < cur_e:
            cur_e = max(cur_e, e)
            continue
        out += (line[pos:cur_s], MASK)
        pos, cur_s, cur_e = cur_e, s, e
    out += (line[pos:cur_s], MASK, line[cur_e:])
    return "".join(out)


class _LineMemo:
    """``hash(line) -> MASK + h(masked line)`` for lines that hold a digit: at most
    :data:`MEMO_LINES` entries (then cleared and refilled), and no prompt text kept (an entry is
    an int and a 17-character string; Python's salted string hash tells lines apart)."""

    def __init__(self, digits: bool) -> None:
        self.digits = digits
        self.table: dict[int, str] = {}

    def digest(self, line: str) -> str:
        key = hash(line)
        hit = self.table.get(key)
        if hit is None:
            text = mask_line(line)
            hit = MASK + _h(text.translate(_DIGITS) if self.digits else text)
            if len(self.table) >= MEMO_LINES:
                self.table.clear()
            self.table[key] = hit
        return hit


_SYSTEM_MEMO, _USER_MEMO = _LineMemo(digits=True), _LineMemo(digits=False)


def key_text(text: str, digits: bool) -> str:
    """What identifies ``text`` in the session id: its first :data:`SESSION_TEXT_CHARS`
    characters (less a cut last line) as ``\\n``-separated lines, each line that holds a digit
    replaced by the digest of its masked form (:func:`mask_line`, then every digit masked when
    ``digits``); a line without a digit holds no volatile span and stands as it is."""
    if len(text) > SESSION_TEXT_CHARS:
        text = text[:SESSION_TEXT_CHARS]
        cut = text.rfind("\n")
        if cut > 0:
            text = text[:cut]
    zeros = text.translate(_DIGITS)  # "0" in a line of it <=> the line holds a digit (C-speed)
    if "0" not in zeros:
        return text
    digest = (_SYSTEM_MEMO if digits else _USER_MEMO).digest
    return "\n".join([z if "0" not in z else digest(line)
                      for line, z in zip(text.split("\n"), zeros.split("\n"))])


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out, size = [], 0
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                out.append(p["text"])
                size += len(p["text"])
                if size >= SESSION_TEXT_CHARS:
                    break
        return "".join(out)
    return ""


def _messages(body: dict[str, Any]) -> list[Any]:
    for field in ("messages", "input"):
        if isinstance(body.get(field), list):
            return body[field]
    return []


def session_texts(body: dict[str, Any]) -> tuple[str, str]:
    """``(system, first_user)`` raw texts of a Chat, Messages or Responses body (module rule)."""
    msgs = _messages(body)
    system = _text_of(body.get("system")) or _text_of(body.get("instructions"))
    if not system:
        system = next((_text_of(m.get("content")) for m in msgs
                       if isinstance(m, dict) and m.get("role") in ("system", "developer")), "")
    if isinstance(body.get("input"), str):
        return system, body["input"]
    first_user = next((_text_of(m.get("content")) for m in msgs
                       if isinstance(m, dict) and m.get("role") == "user"), "")
    return system, first_user


def session_id_for(headers: Mapping[str, str], body: dict[str, Any]) -> str:
    """The session id of a request (module rule): the header's, else ``auto-`` + 16 hex digits."""
    explicit = headers.get(SESSION_HEADER)
    if explicit:
        return explicit
    key = headers.get("authorization") or headers.get("x-api-key") or ""
    system, first_user = session_texts(body)
    memo = hash((key, system, first_user))  # salted, as _LineMemo's: no text kept
    hit = _IDS.get(memo)
    if hit is None:
        hit = session_id_of(key, system, first_user)
        if len(_IDS) >= MEMO_IDS:
            _IDS.clear()
        _IDS[memo] = hit
    return hit


_IDS: dict[int, str] = {}


def session_id_of(key: str, system: str, first_user: str) -> str:
    """``auto-`` + 16 hex digits for ``key`` (the caller's key header) and a body's
    ``(system, first_user)`` texts (module rule), computed without the memo."""
    return "auto-" + _h("|".join((_h(key), _h(key_text(system, True)),
                                  _h(key_text(first_user, False)))))


def session_hash(session_id: str) -> str:
    """What the ledger stores instead of the session id."""
    return _h("session:" + session_id)
