"""Recognize spans that change on every request (clock times, dates, UUIDs, request ids,
timestamps), so a prefix break can be blamed on them (case B03).

Used by :mod:`prefixgate.cache.savings.breaks` only for diagnosis; the rewriter has its own detector
for moving such spans. ``mask`` replaces each span with a placeholder naming its kind, so two texts
that differ only in volatile spans mask to the same string.
"""

from __future__ import annotations

import re

from prefixgate.cache.provider_models.prefix_blocks import common_prefix_len, common_suffix_len

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                        r"[0-9a-fA-F]{12}\b")),
    ("datetime", re.compile(
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?"
        r"(?:\s?(?:[AaPp]\.?[Mm]\.?))?(?:\s?(?:UTC|GMT|[ECMP][SD]T))?")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|"
                        r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]{0,6},?\s{1,4}(?:\d{1,2}\s{1,4})?"
                        r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]{0,6}\.?"
                        r"(?:\s{1,4}\d{1,2})?(?:,?\s{1,4}\d{4})?")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?\b")),
    ("unix_ts", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b")),
    ("hex_id", re.compile(r"\b(?=[0-9a-f]{0,127}\d)(?=[0-9a-f]{0,127}[a-f])[0-9a-f]{16,128}\b")),
    ("request_id", re.compile(r"\b(?:req|request|trace|run|session)[-_][A-Za-z0-9]{6,128}\b")),
)
"""``(kind, pattern)``, earlier wins on overlap. Every quantifier is bounded (ids and hex runs
at most 128 characters, month and day names at most 9 letters), so one match attempt examines
at most a few hundred characters and a scan is linear (``tests/rewriter/test_linear_scans.py``)."""

_B64 = r"[A-Za-z0-9+/_-]"
IDENTITY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = _PATTERNS + (
    ("base64_id", re.compile(
        rf"(?<!{_B64})(?={_B64}{{0,95}}\d)(?={_B64}{{0,95}}[A-Z])(?={_B64}{{0,95}}[a-z])"
        rf"{_B64}{{16,96}}={{0,2}}(?![A-Za-z0-9+/_=-])")),
    ("counter", re.compile(
        r"(?i:\b(?:turn|step|iteration|iter|attempt|try|round|retry|request|call|message|msg|seq"
        r"|sequence|counter|run)\b)\W{0,3}#?(?P<v>\d{1,9})\b")),
)
"""The spans an automatic session key ignores (``prefixgate.proxy.pipeline.session_key``): the
diagnosis patterns above plus two kinds only identity needs. Shapes: ``base64_id`` — a maximal
run of 16..96 base64 / base64url characters (``[A-Za-z0-9+/_-]``, up to two ``=``) holding a
digit, an upper- and a lower-case letter (``secrets.token_urlsafe``, nanoid, JWT parts; an
English word or a lower-case identifier never has all three); ``counter`` — a number of up to 9
digits after a counting label (``turn 7``, ``step #3``, ``attempt: 2``; the span is the number,
group ``v``). Bounded like the rest (three lookaheads and the run, 96 characters each: a
reach of 390): linear scans."""


def find_spans(text: str) -> list[tuple[int, int, str]]:
    """Non-overlapping volatile spans ``[(start, end, kind)]`` in ``text``, in order.

    Earlier patterns win on overlap (a datetime is not also reported as a date and a time).
    """
    kept: list[tuple[int, int, str]] = []
    for kind, pat in _PATTERNS:
        kept = _merge(kept, [(m.start(), m.end(), kind) for m in pat.finditer(text)
                             if m.end() > m.start()])
    return kept


def _merge(kept: list[tuple[int, int, str]], new: list[tuple[int, int, str]]
           ) -> list[tuple[int, int, str]]:
    """``kept`` plus the spans of ``new`` (sorted, non-overlapping) that overlap no kept span;
    one linear sweep over both lists (the old all-pairs check was quadratic)."""
    out: list[tuple[int, int, str]] = []
    i = 0
    for span in new:
        s, e, _ = span
        while i < len(kept) and kept[i][1] <= s:
            out.append(kept[i])
            i += 1
        if i < len(kept) and kept[i][0] < e:
            continue
        out.append(span)
    out.extend(kept[i:])
    return out


def mask(text: str) -> str:
    """``text`` with every volatile span replaced by ``⟨kind⟩``."""
    out: list[str] = []
    pos = 0
    for s, e, kind in find_spans(text):
        out.append(text[pos:s])
        out.append(f"\u27e8{kind}\u27e9")
        pos = e
    out.append(text[pos:])
    return "".join(out)


#: Characters kept on each side of the differing region when comparing (longer than any span).
DIFF_MARGIN = 48


def _diff_window(before: str, after: str) -> tuple[str, str]:
    """The differing middle of two texts plus ``DIFF_MARGIN`` characters of context each side."""
    p = common_prefix_len(before, after)
    s = common_suffix_len(before, after, min(len(before), len(after)) - p)
    lo = max(0, p - DIFF_MARGIN)
    return (before[lo:len(before) - max(0, s - DIFF_MARGIN)],
            after[lo:len(after) - max(0, s - DIFF_MARGIN)])


def kinds_in_diff(before: str, after: str) -> list[str]:
    """Kinds of volatile spans whose text differs between two versions of a text that mask
    equal; ``[]`` when the difference is not explained by volatile spans alone.

    Only the differing region (with a margin) is scanned, so long texts cost little.
    """
    if before == after:
        return []
    before, after = _diff_window(before, after)
    if mask(before) != mask(after):
        return []
    a, b = find_spans(before), find_spans(after)
    kinds: list[str] = []
    for (s1, e1, k1), (s2, e2, _) in zip(a, b):
        if before[s1:e1] != after[s2:e2] and k1 not in kinds:
            kinds.append(k1)
    return kinds
