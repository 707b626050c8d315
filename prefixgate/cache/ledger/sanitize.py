"""Ledger values made storable before they reach SQLite, the spool or PostgreSQL (issue 34,
"the record survives hostile content").

A ledger row carries strings a client or an upstream chose — the model name, a tenant header, an
upstream's error text — and numbers an upstream reported. Some of them no store takes:

- U+0000: PostgreSQL ``TEXT`` refuses it (``DataError: PostgreSQL text fields cannot contain NUL
  (0x00) bytes``); SQLite keeps it but cuts it at the first NUL in most readers.
- A lone surrogate (U+D800..U+DFFF not in a pair, what ``"\\ud800"`` in a JSON string decodes
  to): neither ``sqlite3`` nor psycopg can encode it to UTF-8 (``UnicodeEncodeError``).
- An integer past 64 bits (a usage count of ``1e20`` written as an integer): PostgreSQL
  ``BIGINT`` is out of range, ``sqlite3`` raises ``OverflowError``.
- A string of megabytes: stored as sent, once per request, and read back by every report.

Before this module one such value made the writer drop its whole batch (up to 512 other rows,
other tenants' included) and, drained from the spool, every row of an outage. :func:`clean_row`
now rewrites each value into one every store takes: NUL and each lone surrogate become U+FFFD
(a surrogate *pair* written as two code points is joined into its character), a string longer
than its column's bound is cut (:data:`TEXT_LIMITS`, :data:`DEFAULT_LIMIT`; a JSON column over
its bound is emptied, :data:`JSON_COLUMNS`, rather than cut into invalid JSON), and an integer
outside the signed 64-bit range or a float that is not finite is stored as NULL ("not
reported"). What a row looked like before is not kept: the ledger stores figures, never what a
client typed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

REPLACEMENT = "\ufffd"
DEFAULT_LIMIT = 256
"""Characters kept of a text column not in :data:`TEXT_LIMITS` (identifiers: model, route,
backend, tenant, deployment, session, key_id, status, ...)."""
TEXT_LIMITS: dict[str, int] = {"error": 4096, "edits": 4096, "attempt_reasons": 4096,
                               "stood_back": 4096, "pass_tokens": 16384, "record": 1 << 20}
"""Characters kept per column (free text and JSON; ``record`` is a cache-break record)."""
JSON_COLUMNS: dict[str, str] = {"pass_tokens": "", "record": "{}"}
"""Columns holding JSON, and what they hold when over their bound (a cut is invalid JSON)."""
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def clean_text(s: str, limit: int = DEFAULT_LIMIT, *, over: str | None = None) -> str:
    """``s`` with NUL and lone surrogates replaced by U+FFFD, at most ``limit`` characters
    (over ``limit``: cut, or ``over`` when given — a JSON column's empty value). ASCII
    without NUL within the bound comes back as is (the common case costs two C-level
    checks)."""
    if s.isascii():
        if "\x00" in s:
            s = s.replace("\x00", REPLACEMENT)
    else:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: pairs joined, the rest replaced
            s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        if "\x00" in s:
            s = s.replace("\x00", REPLACEMENT)
    if len(s) > limit:
        return s[:limit] if over is None else over
    return s


def clean_value(column: str, v: Any) -> Any:
    """One column's value as every store takes it (module docstring); other types unchanged."""
    if isinstance(v, str):
        return clean_text(v, TEXT_LIMITS.get(column, DEFAULT_LIMIT), over=JSON_COLUMNS.get(column))
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if INT64_MIN <= v <= INT64_MAX else None
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return v


def _clean_in_place(out: list[Any], columns: Sequence[str]) -> None:
    """Clean ``out`` (values in ``columns`` order) in place. The fast path — ASCII text without
    NUL within its bound, integers in range, finite floats — costs one type test and a couple
    of C-level checks per value (this runs in the writer thread, per row)."""
    for i, v in enumerate(out):
        t = type(v)
        if t is str:
            c = columns[i]
            if not (v.isascii() and "\x00" not in v and len(v) <= TEXT_LIMITS.get(c, DEFAULT_LIMIT)):
                out[i] = clean_value(c, v)
        elif t is int:
            if not INT64_MIN <= v <= INT64_MAX:
                out[i] = None
        elif t is float:
            if v - v != 0.0:  # inf - inf and nan - nan are nan
                out[i] = None
        elif v is not None and t is not bool:
            out[i] = clean_value(columns[i], v)  # a subclass of str / int / float


def clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (column -> value) with every value cleaned, in place; returns it."""
    keys = list(row)
    vals = list(row.values())
    _clean_in_place(vals, keys)
    for k, v in zip(keys, vals):
        row[k] = v
    return row


def clean_values(columns: Sequence[str], values: Iterable[Any]) -> tuple[Any, ...]:
    """``values`` (in ``columns`` order) cleaned, as a tuple (the SQLite writer's shape)."""
    out = list(values)
    _clean_in_place(out, columns)
    return tuple(out)
