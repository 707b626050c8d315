"""Request-controlled text made safe for a log line (issue 8, HTTP hygiene).

A client chooses the ``model`` string, the path (``%0A`` decodes to a newline), header values:
written raw, ``"gpt-4\\n2026-01-01 prefixgate.proxy /v1/x admin login ok"`` forges a second log
line. :func:`safe` escapes every character that could end or rewrite a line on a terminal or in
a log shipper — C0 controls (CR, LF, TAB, ESC ...), DEL, C1 controls, U+2028 / U+2029 (line and
paragraph separators) and other Unicode format / separator characters — as ``\\xNN`` /
``\\uNNNN`` (``\\n``, ``\\r``, ``\\t`` by name), and truncates. :class:`SafeFormatter`
does the same to every log message of the process (``prefixgate serve`` installs it), so a
call site that forgets :func:`safe` still cannot forge a line. Tracebacks keep their lines (the
frames are our code); the exception's own message, which may quote request data, is escaped.
It also bounds what a call site forgets to cut (issue 20, class 5): each string argument at
:data:`~prefixgate.proxy.core.bounded.LOG_ARG_CHARS`, each message and exception message at
:data:`~prefixgate.proxy.core.bounded.LOG_MESSAGE_CHARS` characters
(:func:`prefixgate.proxy.core.bounded.clip`).
"""

from __future__ import annotations

import copy
import logging
import traceback
import unicodedata
from types import TracebackType
from typing import Any

from prefixgate.proxy.core.bounded import LOG_ARG_CHARS, LOG_MESSAGE_CHARS, clip

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


def _traceback_lines(te: traceback.TracebackException) -> list[str]:
    """``te`` formatted as Python does (chained causes first), with each exception's own
    ``Type: message`` line(s) escaped onto one line."""
    out: list[str] = []
    if te.__cause__ is not None:
        out += _traceback_lines(te.__cause__)
        out.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif te.__context__ is not None and not te.__suppress_context__:
        out += _traceback_lines(te.__context__)
        out.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    if te.stack:
        out.append("Traceback (most recent call last):\n")
        out += te.stack.format()
    only = "".join(te.format_exception_only()).rstrip("\n")
    out.append(escape(clip(only, LOG_MESSAGE_CHARS)) + "\n")
    return out


def _clip_args(args: Any) -> Any:
    """``record.args`` with each ``str`` (or ``bytes``) argument cut to ``LOG_ARG_CHARS``."""
    def one(a: Any) -> Any:
        if isinstance(a, (bytes, bytearray)) and len(a) > LOG_ARG_CHARS:
            return bytes(a[:LOG_ARG_CHARS]) + b"..."
        return clip(a, LOG_ARG_CHARS) if isinstance(a, str) else a
    if isinstance(args, tuple):
        return tuple(one(a) for a in args)
    if isinstance(args, dict):
        return {k: one(v) for k, v in args.items()}
    return args


class SafeFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose message part (``%(message)s``) is :func:`escape`\\ d, and
    whose tracebacks escape each exception's message (see module docstring). Use it for every
    handler of a process that logs request-controlled values."""

    def format(self, record: logging.LogRecord) -> str:
        if record.args:  # cut long arguments before they are merged into the message
            record = copy.copy(record)
            record.args = _clip_args(record.args)
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        rec = copy.copy(record)
        rec.message = escape(clip(record.message, LOG_MESSAGE_CHARS))
        return super().formatMessage(rec)

    def formatException(  # noqa: N802 - logging's name
            self, ei: tuple[type[BaseException], BaseException, TracebackType | None]
            | tuple[None, None, None]) -> str:
        if ei[1] is None:
            return super().formatException(ei)
        te = traceback.TracebackException(type(ei[1]), ei[1], ei[2])
        return "".join(_traceback_lines(te)).rstrip("\n")
