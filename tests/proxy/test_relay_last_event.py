"""The relay forwards an upstream's last event even when the stream ends without the blank line
that terminates it (SSE: a final event may be dispatched at end of stream by lenient servers;
dropping it would lose ``[DONE]`` or the last tokens). Passthrough stays byte-identical."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx

from prefixgate.proxy.core.usage import OpenAIStreamWatcher
from prefixgate.proxy.upstream.relay import StreamRelay, Timing

EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n', b"data: [DONE]"]


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c

    async def aclose(self) -> None:
        return None


def _relay(chunks: list[bytes]) -> tuple[list[bytes], list[str]]:
    ended: list[str] = []

    async def on_end(status: str, http_status: int) -> None:
        ended.append(status)

    async def go() -> list[bytes]:
        resp = httpx.Response(200, stream=_Body(chunks))
        relay = StreamRelay(resp, OpenAIStreamWatcher(), Timing(), on_end)
        return [b async for b in relay.events()]

    return anyio.run(go), ended


def test_a_final_event_without_its_blank_line_is_still_relayed() -> None:
    out, ended = _relay(EVENTS)
    assert b"".join(out) == b"".join(EVENTS) and out[-1] == b"data: [DONE]"
    assert ended == ["ok"]


def test_a_final_event_split_across_chunks_without_its_blank_line_is_relayed_whole() -> None:
    raw = b"".join(EVENTS)
    out, _ = _relay([raw[:30], raw[30:-5], raw[-5:]])
    assert b"".join(out) == raw
