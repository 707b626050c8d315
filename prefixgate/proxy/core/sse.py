"""Server-Sent Events framing: reassemble events from arbitrary byte reads (case B11).

The network (and every proxy on the way) re-chunks bytes at arbitrary offsets, so nothing may be
parsed until a whole event is in hand. Per the WHATWG SSE spec, lines end in ``\\r\\n``, ``\\n``
or ``\\r``, and an event ends at an empty line. :class:`EventSplitter` cuts the byte stream
exactly there and returns each event's ORIGINAL bytes (terminator included), so concatenating its
output reproduces the input byte for byte; :func:`parse_event` reads one event's fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class EventSplitter:
    """Feed byte chunks, get complete SSE events (original bytes, blank-line terminator included).

    ``feed(b'data: {"a":1')`` -> ``[]``; ``feed(b'}\\n\\n')`` -> ``[b'data: {"a":1}\\n\\n']``.
    ``flush()`` returns the trailing bytes of an unterminated last event (or ``b""``).
    A ``\\r`` at the end of the buffer is held back until the next byte shows whether it is a
    ``\\r\\n`` pair.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0          # next index of _buf not yet scanned for line ends
        self._line_start = 0    # index where the current (unfinished) line starts

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return every event completed by it, in order."""
        self._buf += data
        events: list[bytes] = []
        buf = self._buf
        i = self._scan
        n = len(buf)
        while i < n:
            c = buf[i]
            if c == 0x0A or c == 0x0D:  # \n or \r
                if c == 0x0D:
                    if i + 1 >= n:
                        break  # wait: could be the first half of \r\n
                    end = i + 2 if buf[i + 1] == 0x0A else i + 1
                else:
                    end = i + 1
                empty_line = i == self._line_start
                i = end
                self._line_start = end
                if empty_line:
                    events.append(bytes(buf[:end]))
                    del buf[:end]
                    n = len(buf)
                    i = 0
                    self._line_start = 0
            else:
                i += 1
        self._scan = i
        return events

    def flush(self) -> bytes:
        """Bytes left over when the stream ends without a final blank line."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._scan = self._line_start = 0
        return rest


@dataclass(frozen=True)
class SSEEvent:
    """One parsed event: ``event`` name (``"message"`` when absent) and ``data`` (data lines
    joined with ``\\n``; None when the event has no data line, e.g. a comment-only event)."""

    event: str
    data: str | None


def parse_event(raw: bytes) -> SSEEvent:
    """Parse one complete event's bytes (from :class:`EventSplitter`). Comments (``:``) and
    unknown fields are ignored; a single space after ``field:`` is stripped (SSE spec)."""
    text = raw.decode("utf-8", errors="replace")
    name = "message"
    data: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line or line.startswith(":"):
            continue
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    return SSEEvent(name, "\n".join(data) if data else None)


# Rewrites one upstream event into the events the client gets (the A->O bridge); None = relay
# the original bytes.
EventMapper = Callable[[bytes, SSEEvent], list[bytes]]
