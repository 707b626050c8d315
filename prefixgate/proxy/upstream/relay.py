"""Send a request upstream and relay the answer, timing it (cases B10, B11; issue 8 class 1).

One shared ``httpx.AsyncClient`` per app (:class:`Upstream`, opened and closed by the app's
lifespan). Every response it returns is counted open until it is closed (``in_use``, the
``prefixgate_upstream_responses_in_use`` gauge): a leak shows as a number that never falls.
:func:`send_unless_gone` abandons a send whose client hung up before the upstream's headers
arrived (the upstream sees its connection close and can stop prefilling).

A streamed answer is relayed event by event, never buffered (:class:`StreamRelay`): bytes are cut
into whole SSE events on blank-line boundaries (:class:`prefixgate.proxy.core.sse.EventSplitter`) and each
event's original bytes are written to the client as soon as it is complete. The relay owns the
upstream response from the moment the handler hands it over: whatever ends the response (the
last byte, a client gone, a failed send, a response never started), :meth:`StreamRelay.close`
runs exactly once — upstream response closed, ``on_end`` called.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

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
from prefixgate.proxy.core.sse import EventSplitter, SSEEvent, parse_event
from prefixgate.proxy.core.usage import Usage
from prefixgate.proxy.http.headers import pin_latin1
from prefixgate.proxy.upstream.aiohttp_client import AiohttpClient, sendable

log = logging.getLogger("prefixgate.relay")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class StreamWatcher(Protocol):
    """Sees each complete event once (see :mod:`prefixgate.proxy.core.usage`)."""

    usage: Usage
    deltas: int
    done: int  # final events seen (OpenAI ``[DONE]``, Anthropic ``message_stop``)
    errors: int  # the upstream's own error events

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


# Connection pool size of the shared client (all backends together).
MAX_CONNECTIONS = 512
MAX_KEEPALIVE = 64


class _CountedStream(httpx.AsyncByteStream):
    """An upstream response body that calls ``on_close`` exactly once, when it is closed (read
    to the end, closed early, or closed on an error)."""

    def __init__(self, inner: httpx.AsyncByteStream, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close: Callable[[], None] | None = on_close

    def __aiter__(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        return self._inner.__aiter__()  # the inner iterator itself: no extra generator

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            done, self._on_close = self._on_close, None
            if done is not None:
                done()


class Upstream:
    """The shared HTTP client. ``start()``/``close()`` from the app lifespan.

    Requests go through aiohttp (:mod:`prefixgate.proxy.upstream.aiohttp_client`: ~20x httpx's throughput
    under concurrency here); through httpx when a test ``transport`` is given, when a header value is
    not UTF-8 (:func:`~prefixgate.proxy.upstream.aiohttp_client.sendable`), or with ``fast=False``.
    ``client`` (httpx) also serves the proxy's own side requests (``/v1/models``).

    ``transport``: an ``httpx.AsyncBaseTransport`` for tests (default: real network);
    ``max_connections``: the pool's size (default :data:`MAX_CONNECTIONS`). ``in_use``: upstream
    responses returned by :meth:`send` and not yet closed.
    """

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None,
                 max_connections: int = MAX_CONNECTIONS, fast: bool = True) -> None:
        self._transport = transport
        self.max_connections = max_connections
        self.client: httpx.AsyncClient | None = None
        self.fast = AiohttpClient(max_connections) if fast and transport is None else None
        self.in_use = 0

    async def start(self) -> None:
        """Open the client (connection pool shared by all requests)."""
        limits = httpx.Limits(max_connections=self.max_connections,
                              max_keepalive_connections=min(MAX_KEEPALIVE, self.max_connections))
        self.client = httpx.AsyncClient(transport=self._transport, limits=limits, http2=False,
                                        follow_redirects=False)
        if self.fast is not None:
            self.fast.max_connections = self.max_connections
            await self.fast.start()

    async def close(self) -> None:
        """Close the clients and their connections."""
        if self.fast is not None:
            await self.fast.close()
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    def _released(self) -> None:
        self.in_use -= 1

    def pool_stats(self) -> dict[str, int]:
        """``{"active", "idle", "queued"}``: the pool's connections serving a request, kept
        alive unused, and requests waiting for a connection — read from httpcore's pool (as its
        own ``repr`` does); ``{}`` with a custom transport or another httpcore layout."""
        if self.fast is not None:
            return self.fast.pool_stats()
        pool = getattr(getattr(self.client, "_transport", None), "_pool", None)
        try:
            idle = [c.is_idle() for c in pool.connections]  # type: ignore[union-attr]
            queued = sum(r.is_queued() for r in pool._requests)  # type: ignore[union-attr]
        except (AttributeError, TypeError):
            return {}
        return {"active": idle.count(False), "idle": idle.count(True), "queued": queued}

    async def send(self, url: str, headers: Mapping[str, bytes], body: bytes,
                   timeout_s: float, connect_s: float | None = None) -> httpx.Response:
        """POST ``body`` and return the response with its body NOT yet read (stream mode).

        Credentials in ``url`` (``http://user:secret@host/v1``) are sent as HTTP Basic auth
        (unless ``headers`` already carry the backend key) and taken out of the URL, so they
        never reach an error message, the ledger or httpx's request log. Raises
        UpstreamUnavailable (502) when the backend cannot be reached, UpstreamTimeout (504)
        when it does not answer in ``timeout_s`` (seconds between two reads; connecting:
        ``connect_s``, default ``min(10, timeout_s)``). The caller must close the response;
        until it does, it counts in ``in_use``.
        """
        if self.fast is not None and sendable(headers):
            fast = await self.fast.send(url, headers, body, timeout_s, self._released, connect_s)
            self.in_use += 1  # no await between the send and here: the count cannot miss it
            return cast(httpx.Response, fast)  # an UpstreamResponse: read as httpx's is
        if self.client is None:
            await self.start()
        assert self.client is not None
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s) if connect_s is None
                                else connect_s)
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
        except httpx.TimeoutException as e:
            raise UpstreamTimeout(f"upstream {target} timed out ({type(e).__name__})") from None
        except httpx.HTTPError as e:
            raise UpstreamUnavailable(
                f"upstream {target} unreachable: {type(e).__name__}") from None
        pin_latin1(resp.headers)  # header values round-trip as the upstream's bytes
        self.in_use += 1  # no await between the send and here: the count cannot miss it
        resp.stream = _CountedStream(resp.stream, self._released)  # type: ignore[arg-type]
        return resp


async def read_at_most(resp: httpx.Response, limit: int) -> bytes:
    """The first ``limit`` bytes of ``resp``'s body (all of it when shorter); the caller closes
    the response. Raises what httpx raises when the body breaks off."""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        parts.append(chunk[: limit - size])
        size += len(parts[-1])
        if size >= limit:
            break
    return b"".join(parts)


async def send_unless_gone(send: Awaitable[httpx.Response],
                           gone: Callable[[], Awaitable[Any]]) -> httpx.Response:
    """Await ``send`` unless ``gone()`` (the client's disconnect) completes first.

    When the client goes first the send is cancelled — httpx closes the connection it was using,
    so the upstream sees its request abandoned — and ClientDisconnected (499) is raised. Whatever
    ends this call (the send's own exception, our task cancelled), a response nobody will take is
    closed, never left open. A ``gone`` that raises only stops the watching.
    """
    sending = asyncio.ensure_future(send)
    watching = asyncio.ensure_future(gone())
    resp: httpx.Response | None = None
    try:
        done, _ = await asyncio.wait((sending, watching), return_when=asyncio.FIRST_COMPLETED)
        if sending not in done and _finished_normally(watching):
            sending.cancel()
        await asyncio.wait((sending,))
        if sending.cancelled():
            raise ClientDisconnected("The client went away before the upstream answered.")
        resp = sending.result()  # the send's own exception propagates from here
        return resp
    finally:
        watching.cancel()
        if resp is None:
            await _discard(sending)


def _finished_normally(task: asyncio.Future[Any]) -> bool:
    if not task.done() or task.cancelled():
        return False
    if task.exception() is not None:
        log.warning("watching for the client's disconnect failed: %r", task.exception())
        return False
    return True


async def _discard(sending: asyncio.Future[httpx.Response]) -> None:
    """Cancel a send whose answer nobody will take; close the response if one came anyway."""
    with anyio.CancelScope(shield=True):
        if not sending.done():
            sending.cancel()
            await asyncio.wait((sending,))
        if not sending.cancelled() and sending.exception() is None:
            await sending.result().aclose()


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
    shielded from cancellation): closes ``resp`` and awaits ``on_end(status, http_status)``.
    ``headers_sent`` is set by :class:`SSEResponse` once the client's response head is out.
    """

    def __init__(self, resp: httpx.Response, watcher: StreamWatcher, timing: Timing,
                 on_end: OnEnd, mapper: EventMapper | None = None, api: Api = "openai",
                 status_code: int = 200, idle_s: float | None = None,
                 deadline: float | None = None, end_mapper: EventMapper | None = None
                 ) -> None:
        self.resp, self.watcher, self.timing = resp, watcher, timing
        self.end_mapper = end_mapper  # the relay's own error event -> the client's API
        self.mapper, self.api, self.status_code = mapper, api, status_code
        self.idle_s, self.deadline = idle_s, deadline  # s between chunks; loop.time() limit
        self._on_end: OnEnd | None = on_end
        self.status = "client_disconnect"  # until the relay knows better
        self.headers_sent = False

    async def events(self) -> AsyncIterator[bytes]:
        """The client's stream: whole events as they complete, then what the end calls for."""
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
            await self.close()

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

    async def close(self) -> None:
        """Close the upstream response and report the end, once; never raises."""
        on_end, self._on_end = self._on_end, None
        if on_end is None:
            return
        self.timing.end = time.perf_counter()
        http_status = self.status_code if self.headers_sent else ClientDisconnected.status
        with anyio.CancelScope(shield=True):  # runs even when the client's task is cancelled
            try:
                await self.resp.aclose()
            except Exception:
                log.exception("closing the upstream response failed")
            try:
                await on_end(self.status, http_status)
            except Exception:
                log.exception("recording the end of a stream failed")


class SSEResponse(StreamingResponse):
    """The client's side of a :class:`StreamRelay`; whatever ends the response, the relay is
    closed.

    Starlette may stop iterating without closing the generator (a send failing on a closed
    socket), or never start it (the client gone before the response head); closing the relay
    here runs its end at once: upstream closed, ledger written. Headers: ``text/event-stream``,
    no cache, no proxy buffering (B10).
    """

    media_type = "text/event-stream"

    def __init__(self, relay: StreamRelay, headers: dict[str, str]) -> None:
        super().__init__(relay.events(), status_code=relay.status_code, headers=headers)
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
