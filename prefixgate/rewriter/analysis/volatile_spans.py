"""Detectors for volatile spans: text that changes between requests faster than a cache lives.

A span is volatile when it would differ on the next request while the text around it stays:
clock readings, request/session ids, UUIDs. Dates *without* a time of day are not flagged: they
change once a day, far slower than the longest prompt-cache TTL (1 hour, Anthropic; OpenAI
in-memory retention is minutes), so moving them would cost more than it saves. Learned
volatility (spans seen changing between requests) is the job of ``hoist_volatile``.

Patterns (each a named regex; the span is group ``v`` when present, else the whole match):

* ``iso_datetime`` — ISO 8601 / RFC 3339 date-times, ``2024-05-15T15:00:00Z``,
  ``2025-03-04 10:15``, ``2024-05-15 15:00:00 EST`` (optional fraction and zone).
* ``rfc2822`` — ``Tue, 04 Mar 2025 10:15:00 +0000``.
* ``long_datetime`` — ``March 4, 2025 at 10:15 AM``, ``4 March 2025 10:15``, ``03/04/2025 10:15``.
* ``labelled_time`` — a bare ``10:15`` / ``10:15:07 pm`` after a word such as *time*, *now*,
  *clock*, *current*, *as of*, *updated*.
* ``epoch`` — 10- or 13-digit Unix time after *timestamp* / *epoch* / *unix time* / *ts*.
* ``uuid`` — RFC 4122 textual UUIDs.
* ``labelled_id`` — an id of 16..128 ``[A-Za-z0-9_-]`` characters with a digit and a letter,
  after a label such as *request id*, *session_id*, *trace-id*, *correlation id*, *nonce*.

Spans introduced as examples (``e.g.``, ``for example``, ``format``, ``such as``, ``like``
right before them) are not volatile: they are documentation, identical on every request.

A detector's span is a *candidate*, not a verdict (issue 19, item 2): a policy may carry a
constant ``The current time is 2024-05-15 15:00:00 EST.`` on every request. ``hoist_volatile``
moves a candidate only once it is seen changing, unless :func:`per_request` says the request's
own text marks it as per-request: the span's line names a request-scoped value (``request id``,
``req_id``, ``nonce``, ``idempotency key``, ``trace id``, ``correlation id``) or says so
(``per request``, ``this request``, ``each request``, ``every request``). A session or
conversation id, a clock of any precision, is per-request only when its line says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_TZ = r"(?:Z|[+-]\d{2}(?::?\d{2})?|UTC|GMT|EST|EDT|CST|CDT|MST|MDT|PST|PDT|CET|CEST|BST|IST|JST|AEST|AEDT)"
_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]{0,6}\.?"
_TIME = r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:\s?[AaPp]\.?[Mm]\.?)?"
_SP = r"\s{1,4}"
_ID = r"[A-Za-z0-9_-]"

MAX_REACH = 512
"""Most characters one match attempt of any pattern here may examine (lookarounds included);
every quantifier is bounded, so a scan costs at most ``MAX_REACH`` steps per start position:
linear in the text (``tests/rewriter/test_linear_scans.py`` checks the bound on the parsed
patterns). The 132 KB freeze of issue 8 was ``labelled_id`` with unbounded lookaheads: every
``request-`` label re-scanned the rest of a long ``[A-Za-z0-9_-]`` run (quadratic)."""

DETECTORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("iso_datetime", re.compile(
        rf"\b\d{{4}}-\d{{2}}-\d{{2}}[T ]\d{{1,2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d{{1,9}})?)?"
        rf"(?:\s?{_TZ})?(?![\w:])")),
    ("rfc2822", re.compile(
        rf"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),?{_SP}\d{{1,2}}{_SP}{_MON}{_SP}\d{{4}}{_SP}{_TIME}"
        rf"(?:{_SP}{_TZ})?(?![\w:])")),
    ("long_datetime", re.compile(
        rf"(?:\b{_MON}{_SP}\d{{1,2}}(?:st|nd|rd|th)?,?{_SP}\d{{4}}|\b\d{{1,2}}{_SP}{_MON}{_SP}\d{{4}}"
        rf"|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}),?{_SP}(?:at{_SP})?{_TIME}(?:\s?{_TZ})?(?![\w:])")),
    ("labelled_time", re.compile(
        rf"(?i:\b(?:time|now|clock|current(?:ly)?|as of|updated|it is)\b)[^\n\d]{{0,20}}"
        rf"(?P<v>{_TIME}(?:\s?{_TZ})?)(?![\w:])")),
    ("epoch", re.compile(
        r"(?i:\b(?:timestamp|epoch|unix time|ts)\b)\W{0,3}(?P<v>\d{10}(?:\d{3})?)\b")),
    ("uuid", re.compile(
        r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("labelled_id", re.compile(
        r"(?i:\b(?:request|req|session|trace|span|correlation|conversation|run|nonce|message)"
        rf"[ _-]?(?:id)?\b)\W{{1,3}}(?P<v>(?={_ID}{{0,127}}\d)(?={_ID}{{0,127}}[A-Za-z])"
        rf"{_ID}{{16,128}})(?!{_ID})")),
)
"""``(kind, pattern)`` in priority order. Ids are 16..128 characters (a longer run is not an
id); month names at most 9 letters; fractions of a second at most 9 digits."""


@dataclass(frozen=True)
class Span:
    """A volatile span ``text[start:end]`` found by detector ``kind``."""

    kind: str
    start: int
    end: int


MEMO_MAX_CHARS = 1 << 16
"""Texts up to this length are memoized (system prompts repeat on every request of a session);
longer ones are scanned each time, so the memo holds at most 512 x 64 K characters."""
WINDOW_CHARS = 1 << 16
"""Long texts are scanned in windows of about this many characters, cut after a newline: each
``finditer`` call is short, so a worker thread scanning megabytes lets the event loop run."""


def find_spans(text: str) -> list[Span]:
    """Non-overlapping volatile spans in ``text``, sorted by start (earlier detectors win ties).

    Linear in ``len(text)`` (see :data:`MAX_REACH`); a span never crosses a window cut (a
    newline every ~64 K characters). Memoized for texts up to :data:`MEMO_MAX_CHARS`.
    """
    if not text:
        return []
    if len(text) <= MEMO_MAX_CHARS:
        return list(_find_spans_memo(text))
    return list(_find_spans(text))


def windows(text: str, size: int = WINDOW_CHARS) -> list[tuple[int, int]]:
    """``[(start, end)]`` covering ``text``, each about ``size`` characters, cut after a newline
    when one lies in the window's second half (else at ``size``)."""
    out: list[tuple[int, int]] = []
    pos, n = 0, len(text)
    while pos < n:
        end = min(n, pos + size)
        if end < n:
            cut = text.rfind("\n", pos + size // 2, end)
            end = cut + 1 if cut >= 0 else end
        out.append((pos, end))
        pos = end
    return out


_EXAMPLE = re.compile(
    r"(?i:e\.g\.|i\.e\.|example|for instance|format|such as|like)\W{0,30}\S{0,30}\W{0,30}$")
"""Text right before a span that marks it as an example value, not a live reading."""


def _is_example(text: str, start: int) -> bool:
    return bool(_EXAMPLE.search(text[max(0, start - 30):start]))


PER_REQUEST = re.compile(
    r"(?i:\b(?:per[ -]request|(?:this|each|every)[ \t]request|request[ _-]?id|req[ _-]?id|nonce"
    r"|idempotency[ _-]key|trace[ _-]?id|correlation[ _-]?id)\b)")
"""Words on a span's line that mark its value as per-request (module docstring)."""
LINE_REACH = 400
"""Characters either side of a span searched for :data:`PER_REQUEST` (bounded: linear)."""


def per_request(text: str, span: Span) -> bool:
    """True when ``text``'s own words mark ``span`` as a per-request value: :data:`PER_REQUEST`
    occurs on the span's line (at most :data:`LINE_REACH` characters either side)."""
    lo = max(0, span.start - LINE_REACH)
    nl = text.rfind("\n", lo, span.start)
    a = lo if nl < 0 else nl + 1
    b = text.find("\n", span.end, span.end + LINE_REACH)
    b = min(len(text), span.end + LINE_REACH) if b < 0 else b
    return bool(PER_REQUEST.search(text, a, b))


def _has_digit(text: str, a: int, b: int) -> bool:
    return any(text.find(d, a, b) >= 0 for d in "0123456789")


@lru_cache(maxsize=512)
def _find_spans_memo(text: str) -> tuple[Span, ...]:
    return _find_spans(text)


def _find_spans(text: str) -> tuple[Span, ...]:
    found: list[Span] = []
    for a, b in windows(text):
        if not _has_digit(text, a, b):  # every span holds a digit (a UUID its version digit)
            continue
        for kind, rx in DETECTORS:
            for m in rx.finditer(text, a, b):
                s, e = (m.span("v") if "v" in rx.groupindex else m.span())
                if e > s and not _is_example(text, m.start()):
                    found.append(Span(kind, s, e))
    found.sort(key=lambda sp: (sp.start, -(sp.end - sp.start)))
    out: list[Span] = []
    for sp in found:
        if out and sp.start < out[-1].end:
            continue
        out.append(sp)
    return tuple(out)
