"""Relay an upstream answer to the client, timing it (cases B10, B11; issue 8 class 1).

The send itself is :mod:`prefixgate.proxy.upstream.client`'s.

A streamed answer is relayed event by event, never buffered (:class:`StreamRelay`): bytes are cut
into whole SSE events on blank-line boundaries (:class:`prefixgate.proxy.core.sse.EventSplitter`) and each
event's original bytes are written to the client as soon as it is complete. The relay owns the
upstream response from the moment the handler hands it over: whatever ends the response (the
last byte, a client gone, a failed send, a response never started), :meth:`StreamRelay.close`
runs exactly once — upstream response closed, ``before_end`` then ``on_end`` called.

Nothing after the answer on the client's critical path (issue 25): served by
:class:`SSEResponse`, the stream's last event goes out and then the response's final (empty)
body message — the end of the client's stream — before ``on_end`` (the ledger row, the break
and counterfactual analysis) runs. What must be in place before the client can send its next
turn runs before that final message: ``before_end`` (session memory, the row's place in the
answer order), at the upstream's end (:meth:`StreamRelay.close_upstream`).

Timing (:class:`Timing`, all milliseconds from the moment the proxy received the request):

- TTFT: until the first content-bearing event (text, tool-call arguments, reasoning) has been
  written to the client; None for non-streamed answers.
- TPOT: ``(last content event - first content event) / (output_tokens - 1)``; output tokens from
  the upstream's usage, else the number of content events; None below 2 tokens.
- total: until the last byte was written.

How a stream ends (``status`` given to ``on_end``):

- ``ok``: the upstream's final event arrived (OpenAI ``data: [DONE]``, Anthropic
  ``message_stop``) and no error event before it.
- ``upstream_error``: the upstream broke off or stayed silent past the backend's ``timeout_s``,
  or ended cleanly WITHOUT its final event (passthrough or bridged: a client would otherwise
  take half an answer for a whole one). The client's stream ends with one error event in its API
  shape (:func:`prefixgate.proxy.core.errors.stream_error_event`; through ``end_mapper`` when given:
  the Responses bridge turns it into ``response.failed``). An incomplete last event (bytes after the
  last blank line) is dropped then: the SSE spec discards it anyway, and glued to the error event
  it would corrupt both. (A final event missing only its blank line still counts as final.)
  Also ``upstream_error``: the upstream sent its own error event — the
  client already has it (relayed, or mapped by the bridge), so no second one is added.
- ``client_disconnect``: the client went away (the generator was closed or cancelled).
- ``InternalError``: a bug in the relay; the client gets an error event, the log a traceback.

An upstream event the watcher or the bridge cannot make sense of (not JSON, wrong shape) is
relayed as is (passthrough) or dropped (bridge); it never ends the stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import httpx
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from prefixgate.proxy.core.errors import (
    Api,
    ClientDisconnected,
    InternalError,
    ProxyError,
    UpstreamTimeout,
    UpstreamUnavailable,
    stream_error_event,
)
from prefixgate.proxy.core.sse import EventMapper, EventSplitter, parse_event
from prefixgate.proxy.core.usage import StreamWatcher

log = logging.getLogger("prefixgate.relay")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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


def _broke_off(e: httpx.HTTPError) -> ProxyError:
    if isinstance(e, httpx.TimeoutException):
        return UpstreamTimeout("upstream went silent mid-stream past its timeout")
    return UpstreamUnavailable(f"upstream broke off mid-stream ({type(e).__name__})")


# on_end(status, http_status): the stream's end (see module docstring) and the HTTP status the
# client got (the response's, or 499 when its headers never left).
OnEnd = Callable[[str, int], Awaitable[None]]


class StreamRelay:
    """One streamed upstream response, relayed to one client (see module docstring).

    ``events()`` yields the client's bytes; ``close()`` ends the relay exactly once (idempotent,
    shielded from cancellation): closes ``resp``, awaits ``before_end()`` (when given), then
    ``on_end(status, http_status)``. ``headers_sent`` is set by :class:`SSEResponse` once the
    client's response head is out.
    """

    def __init__(self, resp: httpx.Response, watcher: StreamWatcher, timing: Timing,
                 on_end: OnEnd, mapper: EventMapper | None = None, api: Api = "openai",
                 status_code: int = 200, idle_s: float | None = None,
                 deadline: float | None = None, end_mapper: EventMapper | None = None,
                 before_end: Callable[[], Awaitable[None]] | None = None) -> None:
        self.resp, self.watcher, self.timing = resp, watcher, timing
        self.end_mapper = end_mapper  # the relay's own error event -> the client's API
        self.mapper, self.api, self.status_code = mapper, api, status_code
        self.idle_s, self.deadline = idle_s, deadline  # s between chunks; loop.time() limit
        self._on_end: OnEnd | None = on_end
        self._before_end = before_end
        self._upstream_open = True
        self.status = "client_disconnect"  # until the relay knows better
        self.headers_sent = False

    async def events(self, report_end: bool = True) -> AsyncIterator[bytes]:
        """The client's stream: whole events as they complete, then what the end calls for.
        Once it ends: :meth:`close` (``report_end``), or only :meth:`close_upstream` (the
        caller calls :meth:`close` once the client's response is complete, as
        :class:`SSEResponse` does)."""
        splitter = EventSplitter()
        try:
            try:
                async for chunk in self._chunks():
                    for raw in splitter.feed(chunk):
                        content, outs = _handle(raw, self.watcher, self.mapper)
                        for out in outs:
                            yield out
                        if content:
                            self.timing.content_written()
                tail = self._ended(splitter.flush())
            except httpx.HTTPError as e:
                self.status, tail = "upstream_error", self._own_error(_broke_off(e))
            except TimeoutError:
                self.status, tail = "upstream_error", self._own_error(UpstreamTimeout(
                    "upstream went silent mid-stream past its idle or total timeout"))
            except Exception as e:  # noqa: BLE001 - a bug here must still end the stream shaped
                exc = InternalError.wrap(e)
                self.status, tail = type(exc).__name__, self._own_error(exc)
            for out in tail:
                yield out
        finally:
            if report_end:
                await self.close()
            else:
                await self.close_upstream()

    def _chunks(self) -> AsyncIterator[bytes]:
        """The upstream's body chunks; with ``idle_s`` / ``deadline`` each wait is bounded
        (TimeoutError past it)."""
        if self.idle_s is None and self.deadline is None:
            return self.resp.aiter_bytes()
        return self._bounded_chunks()

    async def _bounded_chunks(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        it = self.resp.aiter_bytes().__aiter__()
        while True:
            limit = [t for t in (self.deadline, None if self.idle_s is None else
                                 loop.time() + self.idle_s) if t is not None]
            async with asyncio.timeout_at(min(limit)):
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    return
            yield chunk

    def _ended(self, rest: bytes) -> list[bytes]:
        """Set the status of a stream the upstream ended cleanly; return what still goes out.

        ``rest``: bytes after the last blank line. When they hold the final (or an error) event
        missing only its terminator, they count and go out; otherwise they are dropped
        (passthrough relays trailing bytes after a final event as they are)."""
        w, tail = self.watcher, list[bytes]()
        if rest and not (w.done or w.errors):
            _, outs = _handle(rest, w, self.mapper)
            tail = list(outs) if (w.done or w.errors) else []
        elif rest and self.mapper is None:
            tail = [rest]
        if w.errors:  # the client has the upstream's own error event already
            self.status = "upstream_error"
            return tail
        if w.done:
            self.status = "ok"
            return tail
        self.status = "upstream_error"
        return self._own_error(UpstreamUnavailable(
            "upstream stream ended without its final event"))

    def _own_error(self, exc: ProxyError) -> list[bytes]:
        """The relay's closing error event for ``exc``, in the client's API (``end_mapper``)."""
        ev = stream_error_event(exc, self.api)
        if self.end_mapper is None:
            return [ev]
        try:
            return self.end_mapper(ev, parse_event(ev)) or [ev]
        except Exception:  # noqa: BLE001 - the plain error event still ends the stream
            log.exception("end mapper failed")
            return [ev]

    async def close_upstream(self) -> None:
        """Close the upstream response and run ``before_end``, once; never raises."""
        if not self._upstream_open:
            return
        self._upstream_open = False
        self.timing.end = time.perf_counter()
        with anyio.CancelScope(shield=True):  # runs even when the client's task is cancelled
            try:
                await self.resp.aclose()
            except Exception:
                log.exception("closing the upstream response failed")
            if self._before_end is not None:
                try:
                    await self._before_end()
                except Exception:
                    log.exception("the stream's before-end work failed")

    async def close(self) -> None:
        """:meth:`close_upstream` (if not done yet), then report the end, once; never raises."""
        on_end, self._on_end = self._on_end, None
        if on_end is None:
            return
        await self.close_upstream()
        http_status = self.status_code if self.headers_sent else ClientDisconnected.status
        with anyio.CancelScope(shield=True):  # runs even when the client's task is cancelled
            try:
                await on_end(self.status, http_status)
            except Exception:
                log.exception("recording the end of a stream failed")


class SSEResponse(StreamingResponse):
    """The client's side of a :class:`StreamRelay`; whatever ends the response, the relay is
    closed — its ``on_end`` once the response's final body message is out (module docstring).

    Starlette may stop iterating without closing the generator (a send failing on a closed
    socket), or never start it (the client gone before the response head); closing the relay
    here runs its end at once: upstream closed, ledger written. Headers: ``text/event-stream``,
    no cache, no proxy buffering (B10).
    """

    media_type = "text/event-stream"

    def __init__(self, relay: StreamRelay, headers: dict[str, str]) -> None:
        super().__init__(relay.events(report_end=False), status_code=relay.status_code,
                         headers=headers)
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_noting_head(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                self.relay.headers_sent = True

        try:
            await super().__call__(scope, receive, send_noting_head)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self.relay.close()
