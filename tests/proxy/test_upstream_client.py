"""The aiohttp upstream client behind the httpx-shaped surface: bytes before a break still
arrive, errors keep httpx's types, every response's close is counted once, credentials in the
URL become Basic auth, and a header value aiohttp cannot send byte for byte goes through httpx."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable

import httpx
import pytest

from prefixgate.proxy.core.errors import UpstreamTimeout, UpstreamUnavailable
from prefixgate.proxy.upstream.aiohttp_client import AiohttpClient, sendable
from prefixgate.proxy.upstream.client import Upstream

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\nx-engine-cached-tokens: 7\r\n\r\n")
EVENT = b'data: {"x":1}\n\n'

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    await reader.readexactly(length)
    return head


def test_bytes_before_a_break_arrive_then_a_read_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(HEAD + hex(len(EVENT))[2:].encode() + b"\r\n" + EVENT + b"\r\n")
        await writer.drain()
        writer.transport.abort()  # dies mid-body

    async def run() -> None:
        server, url = await _serve(cut)
        closed: list[int] = []
        client = AiohttpClient()
        try:
            resp = await client.send(url, {"content-type": b"application/json"}, b"{}", 5.0,
                                     lambda: closed.append(1))
            assert resp.status_code == 200 and resp.headers["x-engine-cached-tokens"] == "7"
            got = b""
            with pytest.raises(httpx.ReadError):
                async for chunk in resp.aiter_bytes():
                    got += chunk
            assert got == EVENT
            await resp.aclose()
            await resp.aclose()
            assert closed == [1]  # once, however often it is closed
        finally:
            await client.close()
            server.close()

    asyncio.run(run())


def test_silence_past_the_timeout_is_a_read_timeout_and_no_answer_a_504() -> None:
    async def hang_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _read_request(reader)
        if b"hang-head" not in head:
            writer.write(HEAD)
            await writer.drain()
        await asyncio.sleep(3)

    async def run() -> None:
        server, url = await _serve(hang_body)
        client = AiohttpClient()
        try:
            resp = await client.send(url, {}, b"{}", 0.3, lambda: None)
            with pytest.raises(httpx.ReadTimeout):
                async for _ in resp.aiter_bytes():
                    pass
            await resp.aclose()
            with pytest.raises(UpstreamTimeout):
                await client.send(url, {"x-request-id": b"hang-head"}, b"{}", 0.3, lambda: None)
        finally:
            await client.close()
            server.close()

    asyncio.run(run())


def test_unreachable_is_a_502_without_the_urls_credentials() -> None:
    async def run() -> None:
        client = AiohttpClient()
        try:
            with pytest.raises(UpstreamUnavailable) as e:
                await client.send("http://user:s3cret@127.0.0.1:9/v1/chat/completions", {},
                                  b"{}", 2.0, lambda: None)
            assert "s3cret" not in e.value.message
        finally:
            await client.close()

    asyncio.run(run())


def test_url_credentials_go_as_basic_auth_and_header_bytes_are_kept() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def run() -> None:
        server, url = await _serve(record)
        up = Upstream()
        await up.start()
        try:
            resp = await up.send(url.replace("http://", "http://u:p%40ss@"),
                                 {"user-agent": "agent é".encode()}, b"{}", 5.0)
            assert await resp.aread() == b"{}" and up.in_use == 1
            await resp.aclose()
            assert up.in_use == 0
        finally:
            await up.close()
            server.close()

    asyncio.run(run())
    head = seen[0]
    assert b"authorization: Basic " + base64.b64encode(b"u:p@ss") + b"\r\n" in head
    assert "agent é".encode() in head  # UTF-8 bytes as the client sent them
    assert b"u:p" not in head.split(b"\r\n")[0]


def test_values_that_are_not_utf8_go_through_httpx() -> None:
    assert sendable({"user-agent": "é".encode()})
    assert not sendable({"user-agent": b"\xe9"})  # latin-1 obs-text: httpx sends it as is
