"""The HTTP server under the proxy: uvicorn with limits (issue 8, HTTP hygiene).

uvicorn by itself (0.54) bounds neither how long a client may take to send its headers nor, with
httptools, how large they may be: 300 clients sending one byte a second each hold a connection
open indefinitely, and a 10 MB header is read in full. :func:`uvicorn_options` runs uvicorn's
httptools protocol (C parser) as :class:`GuardedHttpToolsProtocol` (~1.7x the requests per
second of uvicorn's pure-Python h11 protocol, which it replaced), which adds:

- a header deadline: a connection's request line + headers must be complete
  ``limits.header_timeout_s`` seconds after the connection opened, or after the first byte of a
  later request on a kept-alive connection. Past it: a bare ``408`` when some bytes came, then
  the connection is closed (nothing was routed, nothing is logged per connection);
- a header size limit: more than ``limits.max_header_bytes`` before the headers end is a ``431``
  in the caller's error shape (the request line's path picks it, as :func:`api_for_path` does),
  then close. (With h11, its own ``max_incomplete_event_size``, set to the same value, backs it
  up for pipelined requests; httptools counts them from their next read.)

Also set: ``timeout_keep_alive`` (idle keep-alive connections), ``limit_concurrency`` (open
connections + running requests; above it uvicorn answers 503) and ``backlog``. The body's own
deadline is enforced in the app (:func:`prefixgate.proxy.http.body.read_body_within`, 408 in the caller's
shape), because only the app knows where a body ends.
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


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, C) with the same header deadline and header size
    limit (module docstring); ~1.7x the requests per second of uvicorn's h11 protocol on the
    proxy's hot path (bench/results/proxy_overhead.json, note).

    "Reading a head" runs from the connection's start, and from the end of each request, until
    the parser reports the headers complete. Bytes are counted per ``data_received`` while a head
    is being read; pipelined bytes that arrive in the same read as the previous request's end are
    counted from the next read on (a read is at most 256 KiB: the bound stays finite)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._head = bytearray()
        self._head_size = 0
        self._in_head = True
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if not self._in_head or self.transport.is_closing():
            return  # headers done meanwhile: the request runs under the app's own deadlines
        if self._head_size:
            self.transport.write(_TIMEOUT_408)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_size += len(data)
            if len(self._head) < _HEAD_KEPT:
                self._head += data[:_HEAD_KEPT - len(self._head)]
            if self._head_size > self.max_header_bytes:
                if self._header_timer is not None:
                    self._header_timer.cancel()
                    self._header_timer = None
                self._in_head = False
                self.transport.write(_response_431(bytes(self._head), self.max_header_bytes))
                self.transport.close()
                return
            self._arm()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # the next request's head; timed from its first byte


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
