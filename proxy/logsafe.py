"""Request-controlled text made safe for a log line (issue 8, HTTP hygiene).

A client chooses the ``model`` string, the path (``%0A`` decodes to a newline), header values:
written raw, ``"gpt-4\\n2026-01-01 prefixgate.proxy /v1/x admin login ok"`` forges a second log
line. :func:`safe` escapes every character that could end or rewrite a line on a terminal or in
a log shipper — C0 controls (CR, LF, TAB, ESC ...), DEL, C1 controls, U+2028 / U+2029 (line and
paragraph separators) and other Unicode format / separator characters — as ``\\xNN`` /
``\\uNNNN`` (``\\n``, ``\\r``, ``\\t`` by name), and truncates. :class:`SafeFormatter`
does the same to every log message of the process (``prefixgate serve`` installs it), so a
call site that forgets :func:`safe` still cannot forge a line; tracebacks, which the formatter
appends after the message, keep their lines.
"""

from __future__ import annotations

import copy
import logging
import unicodedata

DEFAULT_LIMIT = 200


_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(c: str) -> str:
    n = ord(c)
    if c in _NAMED:
        return _NAMED[c]
    if n < 0x20 or 0x7F <= n <= 0x9F:
        return f"\\x{n:02x}"
    if n > 0x7F and unicodedata.category(c) in ("Zl", "Zp", "Cf", "Cc", "Cs"):
        return f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"
    return c


def escape(text: str) -> str:
    """``text`` with line-breaking and control characters escaped (see module docstring);
    printable text, including non-ASCII letters, is unchanged. Backslashes are doubled so an
    escaped sequence cannot be confused with one the client typed."""
    if text.isprintable() and "\\" not in text:
        return text  # fast path: nothing to escape
    return "".join(_escape_char(c) for c in text)


def safe(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """``str(value)`` escaped (:func:`escape`) and cut to ``limit`` characters, the cut
    marked ``…(+N chars)``; for request-controlled values in log arguments."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    out = escape(text)
    return out + f"…(+{cut} chars)" if cut > 0 else out


class SafeFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose message part (``%(message)s``) is :func:`escape`\\ d; the
    traceback appended after it is not. Use it for every handler of a process that logs
    request-controlled values."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        rec = copy.copy(record)
        rec.message = escape(record.message)
        return super().formatMessage(rec)
