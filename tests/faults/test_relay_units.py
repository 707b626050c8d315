"""The relay's ownership rules in isolation: a response counts as in use until closed, a send is
abandoned when the client leaves first, a stream whose head never left still closes its upstream
and reports 499 (issue 8, classes 1 and 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from prefixgate.proxy.core.errors import ClientDisconnected, UpstreamUnavailable
from prefixgate.proxy.core.usage import OpenAIStreamWatcher
from prefixgate.proxy.upstream.client import Upstream, send_unless_gone
from prefixgate.proxy.upstream.relay import SSEResponse, StreamRelay, Timing


class _Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts, self.closed = parts, False

    async def __aiter__(self) -> Any:
        for p in self.parts:
            yield p

    async def aclose(self) -> None:
        self.closed = True


async def test_upstream_counts_a_response_in_use_until_it_is_closed() -> None:
    up = Upstream(httpx.MockTransport(lambda req: httpx.Response(
        200, stream=_Body([b"data: [DONE]\n\n"]))))
    await up.start()
    a = await up.send("http://u/v1/chat/completions", {}, b"{}", 5)
    b = await up.send("http://u/v1/chat/completions", {}, b"{}", 5)
    assert up.in_use == 2
    await a.aclose()
    await a.aclose()  # twice: counted once
    assert up.in_use == 1
    await b.aread()  # read to the end: httpx closes it
    assert up.in_use == 0
    await up.close()


async def test_send_unless_gone_cancels_the_send_when_the_client_leaves_first() -> None:
    events: list[str] = []

    async def send() -> httpx.Response:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("send cancelled")
            raise
        raise AssertionError("not reached")

    async def gone() -> None:
        events.append("client gone")

    with pytest.raises(ClientDisconnected):
        await send_unless_gone(send(), gone)
    assert events == ["client gone", "send cancelled"]


async def test_send_unless_gone_returns_the_response_and_stops_watching() -> None:
    watching: list[str] = []

    async def send() -> httpx.Response:
        return httpx.Response(200)

    async def gone() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            watching.append("stopped")
            raise

    r = await send_unless_gone(send(), gone)
    await asyncio.sleep(0)
    assert r.status_code == 200 and watching == ["stopped"]


async def test_send_unless_gone_passes_the_send_error_through() -> None:
    async def send() -> httpx.Response:
        raise UpstreamUnavailable("down")

    async def gone() -> None:
        await asyncio.sleep(30)

    with pytest.raises(UpstreamUnavailable):
        await send_unless_gone(send(), gone)


async def test_stream_whose_head_never_left_closes_upstream_and_records_499() -> None:
    """The client is gone before the response head: Starlette never starts the generator, the
    relay still closes the upstream response and reports (client_disconnect, 499)."""
    body = _Body([b"data: [DONE]\n\n"])
    ended: list[tuple[str, int]] = []

    async def on_end(status: str, http_status: int) -> None:
        ended.append((status, http_status))

    relay = StreamRelay(httpx.Response(200, stream=body), OpenAIStreamWatcher(), Timing(),
                        on_end)
    response = SSEResponse(relay, headers={})

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("socket closed")

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    with pytest.raises(Exception):  # noqa: B017 - Starlette's ClientDisconnect
        await response(scope, receive, send)
    assert body.closed
    assert ended == [("client_disconnect", 499)]


async def test_stream_relay_reports_once_with_the_status_the_client_got() -> None:
    body = _Body([b"data: {}\n\n", b"data: [DONE]\n\n"])
    ended: list[tuple[str, int]] = []

    async def on_end(status: str, http_status: int) -> None:
        ended.append((status, http_status))

    relay = StreamRelay(httpx.Response(200, stream=body), OpenAIStreamWatcher(), Timing(),
                        on_end)
    relay.headers_sent = True
    out = [chunk async for chunk in relay.events()]
    await relay.close()
    assert out == [b"data: {}\n\n", b"data: [DONE]\n\n"]
    assert body.closed and ended == [("ok", 200)]
