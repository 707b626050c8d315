"""The proxy's pooled HTTP client of its backends, and sending a request whose client may leave.

One shared client per app (:class:`Upstream`, opened and closed by the app's lifespan). Every
response it returns is counted open until it is closed (``in_use``, the
``prefixgate_upstream_responses_in_use`` gauge): a leak shows as a number that never falls.
:func:`send_unless_gone` abandons a send whose client hung up before the upstream's headers
arrived (the upstream sees its connection close and can stop prefilling); :func:`discard`
cancels a send nobody will take and closes its response if one came anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import anyio
import httpx

from prefixgate.proxy.core.errors import ClientDisconnected, UpstreamTimeout, UpstreamUnavailable
from prefixgate.proxy.http.headers import pin_latin1
from prefixgate.proxy.upstream.aiohttp_client import MAX_CONNECTIONS, AiohttpClient, sendable

log = logging.getLogger("prefixgate.relay")

JSON = "application/json"
#: An upstream error body (or a side answer) is read up to this much; the rest is dropped (cut,
#: it is no longer JSON and is answered in the caller's shape, quoting its start).
ERROR_BODY_MAX_BYTES = 1 << 20


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
            await discard(sending)


def _finished_normally(task: asyncio.Future[Any]) -> bool:
    if not task.done() or task.cancelled():
        return False
    if task.exception() is not None:
        log.warning("watching for the client's disconnect failed: %r", task.exception())
        return False
    return True


async def discard(sending: asyncio.Future[httpx.Response]) -> None:
    """Cancel a send whose answer nobody will take; close the response if one came anyway."""
    with anyio.CancelScope(shield=True):
        if not sending.done():
            sending.cancel()
            await asyncio.wait((sending,))
        if not sending.cancelled() and sending.exception() is None:
            await sending.result().aclose()
