"""Client-chosen strings bounded before they reach a sink (issue 20, class 5).

A client chooses the ``model`` string, the path, the session and tenant headers, ids, and much
of the error text (a 400 quotes the field it refuses; an upstream error quotes the request).
Written in full, one 5 MB model name became a 160 MB ``/metrics`` scrape, 3 MB OpenTelemetry
exports and 5 MB ledger rows. Every sink therefore bounds such a string with :func:`clip`:

- a metric label (:mod:`prefixgate.proxy.observe.metrics`): at most :data:`LABEL_CHARS`, and
  only from a vocabulary fixed when the app is built (:class:`~prefixgate.proxy.observe.metrics.LabelGuard`);
- a span attribute or span name (:mod:`prefixgate.proxy.observe.otel`): :data:`ATTR_CHARS`;
- a ledger row (:meth:`prefixgate.proxy.pipeline.exchange.ProxyState.record`, the one place
  every row passes before the ledger, the metrics, OTel and the log): :data:`ROW_CHARS` per
  column, :func:`clip_fields`; a cache-break record: :data:`BREAK_CHARS` per string value;
- a log line: :func:`prefixgate.proxy.core.logsafe.safe` (per value) and
  :class:`~prefixgate.proxy.core.logsafe.SafeFormatter` (per argument and per message,
  :data:`LOG_ARG_CHARS` / :data:`LOG_MESSAGE_CHARS`).

Limits are counts of characters (code points), so a clipped value is at most 4x that in UTF-8
bytes. A clipped value keeps its head and ends with a marker naming how much was cut and a
short hash of the whole text (``gpt-4o-…[+5242812 chars #1f0c9a2e]``): two long names that
share a head stay distinct in the ledger and in reports, and the same name always clips to the
same text, so grouping by it still works. The result is never longer than the limit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

LABEL_CHARS = 128
"""Longest metric label value (characters); a longer model name is never a label (``other``)."""
ATTR_CHARS = 256
"""Longest OpenTelemetry span attribute value or span name (characters)."""
LOG_ARG_CHARS = 1000
"""Longest string argument of one log call (characters), cut by ``SafeFormatter``."""
LOG_MESSAGE_CHARS = 8000
"""Longest log message (characters), after its arguments are merged, cut by ``SafeFormatter``."""
BREAK_CHARS = 1000
"""Longest string value of a stored cache-break record (characters)."""

ROW_CHARS: Mapping[str, int] = {
    # client-chosen: the body's model, the request path, the tenant header, the session header
    # (stored as its hash, bounded anyway), error text quoting the request or the upstream
    "model": 256, "endpoint": 256, "tenant": 256, "session": 128, "error": 1000,
    # the proxy's own, bounded here so that no column of a row is unbounded
    "route": 256, "backend": 256, "deployment": 256, "status": 128, "edits": 2000,
    "attempt_reasons": 1000, "key_id": 128, "cf_source": 32, "ttft_source": 32, "stood_back": 1000,
    "row_id": 64, "replica": 128,  # issue 26: the proxy's row id (32 hex), the replica's name
    "reported_miss": 64, "predicted_miss": 32,  # issue 35: a provider's reason, our cause
    "trial": 64,  # issue 36: the move a meaning-guard trial send judged
}
"""Longest text per ledger column (characters). ``pass_tokens`` is absent on purpose: it is JSON
the proxy builds from pass names (bounded by the pass list), and a cut would make it unreadable."""

_HASH_HEX = 8
_MIN_FOR_MARKER = 40  # below this a marker would leave no head: cut without one


def _marker(text: str, cut: int) -> str:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    return f"…[+{cut} chars #{digest}]"


def clip(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its head and a marker
    (``…[+N chars #hash8]``, N = the characters cut, hash8 = the first 8 hex digits of the
    sha256 of the whole UTF-8 text), at most ``limit`` characters in all. A ``limit`` under 40
    cuts without a marker. ``limit`` must be >= 0."""
    if len(text) <= limit:
        return text
    if limit < _MIN_FOR_MARKER:
        return text[:limit]
    head = limit
    while True:  # the marker's own length depends on N; two rounds at most
        mark = _marker(text, len(text) - head)
        if head + len(mark) <= limit:
            return text[:head] + mark
        head = limit - len(mark)


def encodable(text: str) -> str:
    """``text`` with each lone surrogate (``"\\ud800"`` is valid JSON, not valid UTF-8) replaced
    by U+FFFD, so SQLite, protobuf and the Prometheus text format can encode it; ``text``
    itself when it has none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def clip_fields(obj: Any, limits: Mapping[str, int] = ROW_CHARS) -> None:
    """Clip, in place, each ``str`` attribute of ``obj`` named in ``limits`` to its limit
    (:func:`clip`) and make it :func:`encodable`; attributes that are missing or not ``str``
    are left alone. For a :class:`prefixgate.cache.ledger.store.LedgerRow`, the default
    :data:`ROW_CHARS`."""
    for name, limit in limits.items():
        value = getattr(obj, name, None)
        if isinstance(value, str):
            bounded = encodable(clip(value, limit))
            if bounded is not value:
                setattr(obj, name, bounded)


def clip_strings(value: Any, limit: int = BREAK_CHARS, depth: int = 8) -> Any:
    """A copy of a JSON-like ``value`` (dicts, lists, tuples, scalars) whose every ``str`` —
    keys included — is clipped to ``limit`` (:func:`clip`); below ``depth`` levels a container
    is replaced by its clipped ``repr``. For records stored as JSON (cache breaks)."""
    if isinstance(value, str):
        return encodable(clip(value, limit))
    if isinstance(value, (dict, list, tuple)) and depth <= 0:
        return encodable(clip(repr(value), limit))
    if isinstance(value, dict):
        return {encodable(clip(str(k), limit)): clip_strings(v, limit, depth - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clip_strings(v, limit, depth - 1) for v in value]
    return value
