"""The HTTP server under the proxy: uvicorn with limits (issue 8, HTTP hygiene; issue 20 High 1).

uvicorn by itself (0.54) bounds neither how long a client may take to send its headers nor, with
httptools, how large they may be: 300 clients sending one byte a second each hold a connection
open indefinitely, and a 10 MB header is read in full. :func:`uvicorn_options` runs uvicorn's
httptools protocol (C parser) as :class:`GuardedHttpToolsProtocol` (~1.7x the requests per
second of uvicorn's pure-Python h11 protocol, which it replaced), which adds:

- a header deadline: a connection's request line + headers must be complete
  ``limits.header_timeout_s`` seconds after the connection opened, or after the first byte of a
  later request on a kept-alive connection. Past it: a bare ``408`` when some bytes came, then
  the connection is closed (nothing was routed, nothing is logged per connection);
- a header size limit: more than ``limits.max_header_bytes`` bytes of request line + headers
  (up to and including the blank line that ends them, RFC 9112 section 2.1) is a ``431`` in the
  caller's error shape (the request line's path picks it, as :func:`api_for_path` does), then
  close. Only head bytes count, however the bytes arrive (:class:`GuardedHttpToolsProtocol`):
  body bytes in the same read as the head, a head split over many reads, pipelined requests in
  one read on a kept-alive connection. (Issue 20: counting whole reads made a 200-byte head +
  64 KiB of body in one read a 431.)

Also set: ``timeout_keep_alive`` (idle keep-alive connections), ``limit_concurrency`` (open
connections + running requests; above it uvicorn answers 503) and ``backlog``. The body's own
deadline is enforced in the app (:func:`prefixgate.proxy.http.body.read_body_within`, 408 in the
caller's shape), because only the app knows when a body is too slow.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from prefixgate.config.schema import Limits
from prefixgate.proxy.core.errors import HeadersTooLarge, api_for_path, error_body

_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
_HEAD_KEPT = 2048  # bytes of the request head kept to read its path for the 431 error's shape
_END = b"\r\n\r\n"  # the blank line ending a head: llhttp (uvicorn's parser) requires CRLF
_HEX = frozenset(b"0123456789abcdefABCDEF")
_LINE_KEPT = 64  # bytes of a chunk-size line kept to read the size (extensions are ignored)


def _response_431(head: bytes, limit: int) -> bytes:
    """A complete ``431`` response whose JSON body is in the shape the request line's path asks
    for (Anthropic for ``/v1/messages*``, OpenAI otherwise)."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
    exc = HeadersTooLarge(f"The request's headers exceed the proxy's limit of {limit} bytes "
                          "(policy limits.max_header_bytes).")
    body = orjson.dumps(error_body(exc, api_for_path(path)))
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
            + body)


def head_end(tail: bytes, data: bytes, start: int, stop: int) -> int:
    """Offset in ``data`` just past the first CRLF CRLF that ends within ``data[start:stop]``,
    or -1. ``tail``: the last (at most 3) head bytes before ``data[start]``, so a blank line split
    across reads is found."""
    if tail:
        k = (tail + data[start:min(stop, start + 3)]).find(_END)
        if k != -1:
            return start + k + len(_END) - len(tail)
    k = data.find(_END, start, stop)
    return -1 if k == -1 else k + len(_END)


class ChunkedEnd:
    """Where a ``transfer-encoding: chunked`` request body ends (RFC 9112 section 7.1: size
    line ``hex[;ext]CRLF``, data, CRLF, ..., ``0CRLF``, trailer lines, CRLF), read across reads.

    Only to know where the next pipelined head starts: the parser (llhttp) still parses the
    body; a size line this cannot read sets ``bad`` (the caller then counts conservatively)."""

    def __init__(self) -> None:
        self._state = "size"  # size | data | trailer
        self._line = b""  # the first _LINE_KEPT bytes of the current line
        self._left = 0  # bytes of chunk data + its CRLF still to come
        self.bad = False  # a size line this cannot read
        self.done = False  # the end was found

    def scan(self, data: bytes, i: int) -> int:
        """Offset in ``data`` just past the body's end, if it ends in ``data[i:]``; else -1
        (the state carries over to the next read)."""
        n = len(data)
        while i < n and not (self.bad or self.done):
            if self._state == "data":
                take = min(self._left, n - i)
                i, self._left = i + take, self._left - take
                if self._left == 0:
                    self._state = "size"
                continue
            j = data.find(b"\n", i)
            stop = n if j == -1 else j
            if len(self._line) < _LINE_KEPT:
                self._line += data[i:min(stop, i + _LINE_KEPT - len(self._line))]
            if j == -1:
                return -1
            i, line, self._line = j + 1, self._line.rstrip(b"\r"), b""
            if self._state == "trailer":
                if not line:
                    self.done = True
                    return i  # the blank line after the last chunk (and its trailers)
                continue
            size = line.split(b";", 1)[0].strip(b" \t")
            if not size or not _HEX.issuperset(size):
                self.bad = True
                return -1
            if int(size, 16) == 0:
                self._state = "trailer"
            else:
                self._state, self._left = "data", int(size, 16) + 2
        return -1


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, C) with the header deadline and header size limit
    of the module docstring; ~1.7x the requests per second of uvicorn's h11 protocol on the
    proxy's hot path (bench/results/proxy_overhead.json, note).

    How only head bytes are counted: each read is cut where a head or a body ends and fed to
    the parser piece by piece (a streaming parser: the same as the bytes arriving in several
    reads). While a head is read, a piece ends just past the first CRLF CRLF (:func:`head_end`,
    across reads) and its bytes count; past ``max_header_bytes`` without that blank line is the
    431, before the parser sees the bytes. Once the parser reports the headers complete, a body
    piece ends where the body ends: ``content-length`` bytes, or the end of a chunked body
    (:class:`ChunkedEnd`), or at once for a request without either. So the bytes after a body in
    the same read — a pipelined request — start the next head exactly. A framing the proxy cannot
    follow (a bad chunk size, the parser ending the body elsewhere; the parser answers 400 for
    the invalid ones) falls back to counting every byte of the read in which the body ended as
    head bytes of the next request: never under the true size."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._header_timer: asyncio.TimerHandle | None = None
        self._head = bytearray()  # the first _HEAD_KEPT bytes of the current head
        self._head_size = 0  # head bytes of the current request so far
        self._tail = b""  # the current head's last 3 bytes (a blank line split across reads)
        self._in_head = True
        self._body: int | ChunkedEnd | None = 0  # content-length left / chunked / unknown
        self._heads = 0  # heads the parser has completed on this connection
        self._refused = False  # a head over the limit: 431 sent or due
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self.lost.done():
            self.lost.set_result(None)
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                      self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._head.clear()
        self._head_size = 0
        self._tail = b""

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if not self._in_head or self.transport.is_closing():
            return  # headers done meanwhile: the request runs under the app's own deadlines
        if self._head_size:
            self.transport.write(_TIMEOUT_408)
        self.transport.close()

    def _too_large(self) -> None:
        """The 431, then close; after the responses to the requests already read (pipelined
        ones before the oversized head), so those are not lost. Reading stops meanwhile."""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._in_head = False
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.flow.pause_reading()
            return  # on_response_complete of the last request read sends it
        self.transport.write(_response_431(bytes(self._head), self.max_header_bytes))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refused and self.cycle.response_complete and not self.transport.is_closing():
            self.transport.write(_response_431(bytes(self._head), self.max_header_bytes))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a 431 is due: nothing more is read from this connection
        view, i, n = memoryview(data), 0, len(data)
        while (i < n and not self._refused and not self.transport.is_closing()
               and self.transport.get_protocol() is self):
            if self._in_head:
                j = self._head_piece(data, i)
                if j < 0:
                    return  # 431 sent or due
                heads = self._heads
                super().data_received(view[i:j])  # type: ignore[arg-type]
                if self._heads == heads:  # the head goes on in the next read
                    self._tail = (self._tail + data[max(i, j - 3):j])[-3:]
            else:
                j = self._body_piece(data, i)
                super().data_received(view[i:j])  # type: ignore[arg-type]
                self._after_body(i, j)
            i = j

    def _head_piece(self, data: bytes, i: int) -> int:
        """End of the head piece starting at ``data[i]`` (its bytes counted); -1: the head is
        over the limit and the 431 went out."""
        room = self.max_header_bytes - self._head_size
        end = head_end(self._tail, data, i, min(len(data), i + max(room, 0)))
        j = end if end != -1 else len(data)
        if end == -1 and j - i > room:
            self._head_size += j - i
            self._keep(data, i, j)
            self._too_large()
            return -1
        self._head_size += j - i
        self._keep(data, i, j)
        self._arm()
        return j

    def _keep(self, data: bytes, i: int, j: int) -> None:
        if len(self._head) < _HEAD_KEPT:
            self._head += data[i:min(j, i + _HEAD_KEPT - len(self._head))]

    def _body_piece(self, data: bytes, i: int) -> int:
        """End of the body piece starting at ``data[i]``: where the body ends, or the read's
        end."""
        n = len(data)
        if isinstance(self._body, int):
            return i + min(self._body, n - i)
        if isinstance(self._body, ChunkedEnd):
            end = self._body.scan(data, i)
            if self._body.bad:
                self._body = None
            return n if end == -1 else end
        return n

    def _after_body(self, i: int, j: int) -> None:
        """Book a body piece the parser has taken."""
        if isinstance(self._body, int):
            self._body -= j - i
            if self._body == 0 and not self._in_head:
                self._body = None  # the parser did not end the body where content-length did
        elif isinstance(self._body, ChunkedEnd) and self._body.done and not self._in_head:
            self._body = None  # the parser did not end the body where the chunks did
        elif self._body is None and self._in_head:
            # the body ended somewhere in this piece: count all of it as the next head's
            self._head_size += j - i
            if self._head_size > self.max_header_bytes:
                self._too_large()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        self._disarm()
        self.scope[CONNECTION_LOST] = self.lost  # type: ignore[literal-required]
        super().on_headers_complete()
        self._body = self._framing()

    def _framing(self) -> int | ChunkedEnd | None:
        """How the body of the request whose headers just completed ends (RFC 9112 section
        6.3): chunked, ``content-length`` bytes, or none (0); None: not known."""
        te = [v for k, v in self.headers or () if k == b"transfer-encoding"]
        cl = [v for k, v in self.headers or () if k == b"content-length"]
        if te:
            last = b",".join(te).split(b",")[-1].strip().lower()
            return ChunkedEnd() if last == b"chunked" and not cl else None
        if len(cl) == 1 and cl[0].strip().isdigit():
            return int(cl[0].strip())
        return None if cl else 0

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # the next request's head; timed from its first byte


CONNECTION_LOST = "prefixgate.connection_lost"
"""Scope key of the request's connection's "lost" future (done once the client's connection
is gone): the send step waits on it for a client that leaves (``pipeline.send.client_gone``)
instead of a task reading ``http.disconnect`` through the middleware (issue 25: two fewer
task steps and a cancellation less per request)."""


def guarded_protocol(limits: Limits) -> type[GuardedHttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` subclass holding ``limits``' header deadline and
    size."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"header_timeout_s": limits.header_timeout_s,
                 "max_header_bytes": limits.max_header_bytes})


def uvicorn_options(limits: Limits) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` enforcing ``limits``:
    ``http`` (the guarded httptools protocol), ``h11_max_incomplete_event_size``,
    ``timeout_keep_alive`` (seconds), ``limit_concurrency``, ``backlog``."""
    return {
        "http": guarded_protocol(limits),
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "timeout_keep_alive": limits.keep_alive_s,
        "limit_concurrency": limits.max_connections,
        "backlog": limits.backlog,
    }
