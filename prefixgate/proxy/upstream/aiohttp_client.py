"""The upstream HTTP client on the hot path: aiohttp behind the small surface the proxy reads.

Why aiohttp (``bench/results/upstream_clients.json``, this machine, 32 concurrent POSTs of 1 KB
to a fast loopback upstream): httpx's default pool ~570 req/s, httpx with the proxy's 512 /
64 limits ~390, httpx over the ``httpx-aiohttp`` transport ~4,000, aiohttp ~11,000. httpx's
pool (httpcore) serialises work per request under concurrency and was the proxy's ceiling.

The proxy reads an upstream answer through four members — ``status_code``, ``headers`` (an
``httpx.Headers`` holding the upstream's raw bytes, decoded as latin-1), ``aiter_bytes()``,
``aread()``, ``aclose()`` — which both an ``httpx.Response`` and :class:`AiohttpResponse` have
(:class:`UpstreamResponse`). Errors keep httpx's types, mapped in ONE place
(:func:`_mapped`): a body that breaks off raises ``httpx.ReadError``, one silent past the read
timeout ``httpx.ReadTimeout``, so the relay's handling (``except httpx.HTTPError``) covers both
clients. A send that fails raises :class:`~prefixgate.proxy.core.errors.UpstreamUnavailable` (502) or
:class:`~prefixgate.proxy.core.errors.UpstreamTimeout` (504), as with httpx.

Timeouts, as :meth:`prefixgate.proxy.upstream.client.Upstream.send` sets them for httpx: connect ``min(10,
timeout_s)``, then at most ``timeout_s`` between two reads (aiohttp ``sock_read``); no total
limit (a long stream is not an error).

Closing: :meth:`AiohttpResponse.aclose` runs ``on_close`` exactly once; a body read to its end
returns the connection to the pool, one closed early closes the connection (the upstream sees
the client gone and can stop decoding).

Header bytes: aiohttp writes header text as UTF-8, so a value is handed over as its bytes
decoded as UTF-8 (same bytes back); a value that is not valid UTF-8 (obs-text, 0x80-0xFF alone)
cannot go through aiohttp unchanged — :func:`sendable` says so and the caller uses httpx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import httpx

from prefixgate.proxy.core.errors import UpstreamTimeout, UpstreamUnavailable

MAX_CONNECTIONS = 512  # connection pool size of the shared client (all backends together)
KEEPALIVE_S = 30.0
READ_CHUNK = 1 << 16


class UpstreamResponse(Protocol):
    """What the proxy reads of an upstream answer (module docstring)."""

    status_code: int
    headers: httpx.Headers

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives (raises httpx.ReadError / ReadTimeout)."""
        ...

    async def aread(self) -> bytes:
        """The whole body."""
        ...

    async def aclose(self) -> None:
        """Release the response (idempotent)."""
        ...


def sendable(headers: Mapping[str, bytes]) -> bool:
    """Whether aiohttp can send every value byte for byte (all values valid UTF-8)."""
    try:
        for v in headers.values():
            v.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@contextmanager
def _mapped() -> Iterator[None]:
    """aiohttp's body errors as httpx's (the one place they are mapped)."""
    import aiohttp

    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as e:
        raise httpx.ReadTimeout(f"upstream silent past the read timeout ({type(e).__name__})"
                                ) from None
    except (aiohttp.ClientError, ConnectionError) as e:
        raise httpx.ReadError(f"upstream body broke off ({type(e).__name__})") from None


def _received_before_error(content: Any) -> bytes:
    """Bytes aiohttp buffered before the body broke off (its ``readany`` raises the error first
    and would drop them); taken out of the buffer, so they are read once."""
    buffer = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    rest = b"".join(buffer)
    buffer.clear()
    return rest


class AiohttpResponse:
    """An aiohttp response seen through :class:`UpstreamResponse`; ``on_close`` runs once."""

    def __init__(self, resp: Any, on_close: Callable[[], None]) -> None:
        self._resp = resp
        self.status_code: int = resp.status
        self.headers = httpx.Headers(list(resp.raw_headers), encoding="iso-8859-1")
        self._on_close: Callable[[], None] | None = on_close
        self._done = False

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """Chunks as they arrive (never empty), until the body ends."""
        content = self._resp.content
        while True:
            try:
                with _mapped():
                    chunk = await content.readany()
            except httpx.HTTPError:
                rest = _received_before_error(content)
                if rest:  # what arrived before the break still reaches the relay, as with httpx
                    yield rest
                raise
            if not chunk:
                self._done = True
                return
            yield chunk

    async def aread(self) -> bytes:
        """The whole body."""
        with _mapped():
            body: bytes = await self._resp.read()
        self._done = True
        return body

    async def aclose(self) -> None:
        """Release (body read to the end: connection back to the pool) or close the
        connection (body not finished); ``on_close`` once."""
        done, self._on_close = self._on_close, None
        if done is None:
            return
        try:
            if self._done:
                self._resp.release()
            else:
                self._resp.close()
        finally:
            done()


class AiohttpClient:
    """One ``aiohttp.ClientSession`` for all backends (``start`` / ``close`` from the app's
    lifespan, in its event loop). ``max_connections``: the pool's size."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS) -> None:
        self.max_connections = max_connections
        self.session: Any = None

    async def start(self) -> None:
        """Open the session (lazily called by :meth:`send` too)."""
        import aiohttp

        if self.session is not None:
            return
        conn = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                    keepalive_timeout=KEEPALIVE_S, enable_cleanup_closed=False)
        self.session = aiohttp.ClientSession(connector=conn, auto_decompress=True,
                                             read_bufsize=READ_CHUNK)

    async def close(self) -> None:
        """Close the session and its connections."""
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()

    def pool_stats(self) -> dict[str, int]:
        """``{"active", "idle", "queued"}`` read from the connector (``{}`` if unreadable)."""
        conn: Any = getattr(self.session, "connector", None)
        try:
            active = len(conn._acquired)
            idle = sum(len(v) for v in conn._conns.values())
            queued = sum(len(w) for w in conn._waiters.values())
        except (AttributeError, TypeError):
            return {}
        return {"active": active, "idle": idle, "queued": queued}

    async def send(self, url: str, headers: Mapping[str, bytes], body: bytes, timeout_s: float,
                   on_close: Callable[[], None], connect_s: float | None = None
                   ) -> AiohttpResponse:
        """POST ``body``; the response with its body not yet read. ``url`` may carry
        ``user:secret@`` (sent as Basic auth unless ``headers`` hold ``authorization``; never in
        an error message). Raises UpstreamUnavailable (502) / UpstreamTimeout (504).
        ``on_close`` runs when the returned response is closed. ``timeout_s``: seconds between
        two reads; ``connect_s``: to connect (default ``min(10, timeout_s)``)."""
        import aiohttp
        from yarl import URL

        await self.start()
        target = URL(url)
        text = {k: v.decode("utf-8") for k, v in headers.items()}
        if target.user is not None:
            if "authorization" not in text:
                text["authorization"] = aiohttp.encode_basic_auth(target.user,
                                                                  target.password or "")
            target = target.with_user(None).with_password(None)
        timeout = aiohttp.ClientTimeout(total=None, connect=min(10.0, timeout_s)
                                        if connect_s is None else connect_s,
                                        sock_read=timeout_s)
        try:
            resp = await self.session.post(target, data=body, headers=text, timeout=timeout,
                                           allow_redirects=False)
        except (TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise UpstreamTimeout(f"upstream {target} timed out ({type(e).__name__})") from None
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamUnavailable(
                f"upstream {target} unreachable: {type(e).__name__}") from None
        return AiohttpResponse(resp, on_close)
