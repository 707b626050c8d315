"""A streamed answer's end-of-stream work runs once the client has the whole stream (issue 25):
the relay's ``on_end`` (ledger row, break and counterfactual analysis) after the response's
final body message, its ``before_end`` (session memory, the row's place in the answer order)
before it; end to end, the next turn of a streamed session still reads the memory the previous
turn wrote, and the row is there for a reader once the stream is read."""

from __future__ import annotations

from typing import Any

import httpx

from prefixgate.proxy.core.usage import OpenAIStreamWatcher
from prefixgate.proxy.upstream.relay import SSEResponse, StreamRelay, Timing


class _Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts, self.closed = parts, False

    async def __aiter__(self) -> Any:
        for p in self.parts:
            yield p

    async def aclose(self) -> None:
        self.closed = True


def _final_sent(sent: list[dict[str, Any]]) -> bool:
    return any(m["type"] == "http.response.body" and not m.get("more_body", False)
               for m in sent)


async def _serve(parts: list[bytes]) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    sent: list[dict[str, Any]] = []
    seen: list[tuple[str, Any]] = []
    body = _Body(parts)

    async def before_end() -> None:
        seen.append(("before_end", _final_sent(sent), body.closed))

    async def on_end(status: str, http_status: int) -> None:
        seen.append(("on_end", _final_sent(sent), (status, http_status)))

    relay = StreamRelay(httpx.Response(200, stream=body), OpenAIStreamWatcher(), Timing(),
                        on_end, before_end=before_end)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await SSEResponse(relay, headers={})({"type": "http", "asgi": {"spec_version": "2.4"}},
                                         receive, send)
    return sent, seen


async def test_on_end_runs_after_the_final_body_message_and_before_end_before_it() -> None:
    sent, seen = await _serve([b"data: {}\n\n", b"data: [DONE]\n\n"])
    assert seen == [("before_end", False, True), ("on_end", True, ("ok", 200))]
    assert b"".join(m.get("body", b"") for m in sent) == b"data: {}\n\ndata: [DONE]\n\n"


async def test_a_broken_stream_still_ends_once_with_its_status_after_the_final_message() -> None:
    sent, seen = await _serve([b"data: {}\n\n"])  # no [DONE]: the relay's own error event
    assert [s[0] for s in seen] == ["before_end", "on_end"]
    assert seen[1][1] is True and seen[1][2] == ("upstream_error", 200)
    assert b"error" in b"".join(m.get("body", b"") for m in sent)


async def test_relay_events_alone_still_report_the_end() -> None:
    """A caller iterating ``events()`` itself (no SSEResponse) gets ``on_end`` as before."""
    ended: list[str] = []

    async def on_end(status: str, http_status: int) -> None:
        ended.append(status)

    relay = StreamRelay(httpx.Response(200, stream=_Body([b"data: [DONE]\n\n"])),
                        OpenAIStreamWatcher(), Timing(), on_end)
    assert [c async for c in relay.events()] == [b"data: [DONE]\n\n"]
    assert ended == ["ok"]
