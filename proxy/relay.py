"""Send a request upstream and relay the answer, timing it (cases B10, B11).

One shared ``httpx.AsyncClient`` per app (:class:`Upstream`, opened and closed by the app's
lifespan). A streamed answer is relayed event by event, never buffered: bytes are cut into whole
SSE events on blank-line boundaries (:class:`proxy.sse.EventSplitter`) and each event's original
bytes are written to the client as soon as it is complete.

Timing (:class:`Timing`, all milliseconds from the moment the proxy received the request):

- TTFT: until the first content-bearing event (text, tool-call arguments, reasoning) has been
  written to the client; None for non-streamed answers.
- TPOT: ``(last content event - first content event) / (output_tokens - 1)``; output tokens from
  the upstream's usage, else the number of content events; None below 2 tokens.
- total: until the last byte was written.

If the client goes away, the upstream response is closed at once (its connection is not leaked,
and the backend sees the disconnect and can stop decoding). If the upstream breaks off or stays
silent past the backend's ``timeout_s`` mid-stream, the client's stream ends with one error event
in its API shape (:func:`proxy.errors.stream_error_event`). An upstream event the watcher or the
bridge cannot make sense of (not JSON, wrong shape) is relayed as is (passthrough) or dropped
(bridge); it never ends the stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.errors import Api, UpstreamTimeout, UpstreamUnavailable, stream_error_event
from proxy.headers import pin_latin1
from proxy.sse import EventSplitter, SSEEvent, parse_event
from proxy.usage import Usage

log = logging.getLogger("prefixgate.relay")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class StreamWatcher(Protocol):
    """Sees each complete event once (see :mod:`proxy.usage`)."""

    usage: Usage
    deltas: int
    done: int  # final events seen (OpenAI ``[DONE]``, Anthropic ``message_stop``)

    def observe(self, ev: SSEEvent) -> bool:
        """Return True when the event carried content."""
        ...


# Rewrites one upstream event into the events the client gets (the A->O bridge); None = relay
# the original bytes.
EventMapper = Callable[[bytes, SSEEvent], list[bytes]]


@dataclass
class Timing:
    """Milestones of one request, ``time.perf_counter()`` seconds; results in ms."""

    start: float = field(default_factory=time.perf_counter)
    first_content: float | None = None
    last_content: float | None = None
    end: float | None = None

    def content_written(self) -> None:
        """Mark that a content-bearing event has just reached the client."""
        now = time.perf_counter()
        if self.first_content is None:
            self.first_content = now
        self.last_content = now

    def ttft_ms(self) -> float | None:
        """Time to first content event, ms (None if none was written)."""
        return None if self.first_content is None else (self.first_content - self.start) * 1e3

    def tpot_ms(self, output_tokens: int | None) -> float | None:
        """Mean time per output token after the first, ms (None below 2 tokens)."""
        if self.first_content is None or self.last_content is None or not output_tokens:
            return None
        if output_tokens < 2:
            return None
        return (self.last_content - self.first_content) * 1e3 / (output_tokens - 1)

    def total_ms(self) -> float:
        """Time until the end of the answer (or now), ms."""
        return ((self.end or time.perf_counter()) - self.start) * 1e3


class Upstream:
    """The shared HTTP client. ``start()``/``close()`` from the app lifespan.

    ``transport``: an ``httpx.AsyncBaseTransport`` for tests (default: real network).
    """

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._transport = transport
        self.client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        """Open the client (connection pool shared by all requests)."""
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(transport=self._transport, limits=limits, http2=False,
                                        follow_redirects=False)

    async def close(self) -> None:
        """Close the client and its connections."""
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    async def send(self, url: str, headers: Mapping[str, bytes], body: bytes,
                   timeout_s: float) -> httpx.Response:
        """POST ``body`` and return the response with its body NOT yet read (stream mode).

        Credentials in ``url`` (``http://user:secret@host/v1``) are sent as HTTP Basic auth
        (unless ``headers`` already carry the backend key) and taken out of the URL, so they
        never reach an error message, the ledger or httpx's request log. Raises
        UpstreamUnavailable (502) when the backend cannot be reached, UpstreamTimeout (504)
        when it does not answer in ``timeout_s``. The caller must close the response.
        """
        if self.client is None:
            await self.start()
        assert self.client is not None
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        target = httpx.URL(url)
        auth = None
        if target.userinfo:
            auth = httpx.BasicAuth(target.username, target.password)
            target = target.copy_with(userinfo=b"")
        raw_headers = [(k.encode("latin-1"), v) for k, v in headers.items()]  # values: bytes
        req = self.client.build_request("POST", target, headers=raw_headers, content=body,
                                        timeout=timeout)
        if auth is not None and "authorization" not in headers:
            req = next(auth.auth_flow(req))
        try:
            resp = await self.client.send(req, stream=True)
            pin_latin1(resp.headers)  # header values round-trip as the upstream's bytes
            return resp
        except httpx.TimeoutException as e:
            raise UpstreamTimeout(f"upstream {target} timed out ({type(e).__name__})") from None
        except httpx.HTTPError as e:
            raise UpstreamUnavailable(
                f"upstream {target} unreachable: {type(e).__name__}") from None


def _handle(raw: bytes, watcher: StreamWatcher,
            mapper: EventMapper | None) -> tuple[bool, list[bytes] | tuple[bytes]]:
    """(carried content, bytes for the client) for one upstream event. An event the watcher or
    the mapper chokes on (wrong shape) counts as no content; passthrough still relays it, a
    bridge drops it."""
    ev = parse_event(raw)
    try:
        content = watcher.observe(ev)
        return content, (mapper(raw, ev) if mapper else (raw,))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        log.warning("malformed upstream stream event skipped by %s: %s",
                    "the bridge" if mapper else "the usage watcher", type(e).__name__)
        return False, ([] if mapper else (raw,))


async def relay_events(resp: httpx.Response, watcher: StreamWatcher, timing: Timing,
                       on_end: Callable[[str], Awaitable[None]],
                       mapper: EventMapper | None = None,
                       api: Api = "openai") -> AsyncIterator[bytes]:
    """Yield the upstream SSE body as whole events, timing content events.

    ``await on_end(status)`` runs exactly once when the relay stops: ``"ok"``,
    ``"client_disconnect"`` (the generator was closed or cancelled) or ``"upstream_error"``
    (the upstream connection broke or timed out mid-stream, or a bridged stream ended without
    the upstream's final event; the last thing yielded is then an error event in the client's
    ``api`` shape). The upstream response is always closed.
    """
    splitter = EventSplitter()
    status = "client_disconnect"
    try:
        try:
            async for chunk in resp.aiter_bytes():
                for raw in splitter.feed(chunk):
                    content, outs = _handle(raw, watcher, mapper)
                    for out in outs:
                        yield out
                    if content:
                        timing.content_written()
            rest = splitter.flush()
            if rest:
                yield rest
            if mapper is not None and not watcher.done:
                # a bridge cannot finish the client's message faithfully without the
                # upstream's final event: say so rather than stop mid-message
                status = "upstream_error"
                yield stream_error_event(UpstreamUnavailable(
                    "upstream stream ended without its final event"), api)
            else:
                status = "ok"
        except httpx.HTTPError as e:
            status = "upstream_error"
            exc = (UpstreamTimeout("upstream went silent mid-stream past its timeout")
                   if isinstance(e, httpx.TimeoutException) else
                   UpstreamUnavailable(f"upstream broke off mid-stream ({type(e).__name__})"))
            yield stream_error_event(exc, api)
    finally:
        timing.end = time.perf_counter()
        with anyio.CancelScope(shield=True):  # runs even when the client's task is cancelled
            await resp.aclose()
            await on_end(status)


class SSEResponse(StreamingResponse):
    """A streaming response that always closes its iterator, whatever ends the response.

    Starlette may stop iterating without closing the generator (a send failing on a closed
    socket); closing it here runs the relay's ``finally`` at once: upstream closed, ledger
    written. Headers: ``text/event-stream``, no cache, no proxy buffering (B10).
    """

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
