"""Streams reach the client event by event, on every path (passthrough, A->O and O->A bridges).

Causality, not milliseconds: the upstream sends its k-th content event only after the client
has received the (mapped) k-1-th one. A proxy or bridge that holds events back until the end
never lets the client see event k-1 while the upstream waits, so the upstream's gate times out
and the test fails — however loaded the machine is.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from prefixgate.cache.ledger.store import Ledger
from prefixgate.proxy.app import build_app
from prefixgate.proxy.core.sse import EventSplitter, parse_event
from tests.proxy.conftest import make_policy
from tests.servers import serve_app

N = 6
GATE_S = 10.0  # a gate that waits this long means the client never saw the previous event


def _word(i: int) -> str:
    return f"w{i}|"


def _openai_events() -> list[bytes]:
    def ev(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"
    return ([ev({"role": "assistant", "content": ""})] + [ev({"content": _word(i)}) for i in range(N)]
            + [ev({}, "stop"), b"data: [DONE]\n\n"])


def _anthropic_events() -> list[bytes]:
    objs: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                              "content": [], "model": "c",
                                              "usage": {"input_tokens": 5, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    objs += [{"type": "content_block_delta", "index": 0,
              "delta": {"type": "text_delta", "text": _word(i)}} for i in range(N)]
    objs += [{"type": "content_block_stop", "index": 0},
             {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
              "usage": {"output_tokens": N}},
             {"type": "message_stop"}]
    return [f"event: {o['type']}\ndata: {json.dumps(o)}\n\n".encode() for o in objs]


class GatedUpstream:
    """Sends ``events``; before the event carrying word i (i >= 1) it waits until the client
    has seen word i-1 (``seen[i-1]`` set by the test's reader). ``gate_timeouts`` counts waits
    that ran out."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events
        self.seen = [threading.Event() for _ in range(N)]
        self.gate_timeouts = 0

    def app(self) -> Starlette:
        async def stream() -> AsyncIterator[bytes]:
            for raw in self.events:
                for i in range(1, N):
                    if _word(i).encode() in raw:
                        ok = await asyncio.to_thread(self.seen[i - 1].wait, GATE_S)
                        self.gate_timeouts += not ok
                yield raw

        async def handle(request: Request) -> StreamingResponse:
            await request.body()
            return StreamingResponse(stream(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", handle, methods=["POST"]),
                                 Route("/v1/messages", handle, methods=["POST"])])


def _client_text(api: str, raw: bytes) -> str:
    ev = parse_event(raw)
    if not ev.data or ev.data == "[DONE]":
        return ""
    obj = json.loads(ev.data)
    if api == "openai":
        return "".join((c.get("delta") or {}).get("content") or "" for c in obj.get("choices", []))
    return (obj.get("delta") or {}).get("text", "") if obj.get("type") == "content_block_delta" else ""


@pytest.fixture
def through(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., int]]:
    """``through(upstream_events, client_api, model) -> gate timeouts`` for one streamed
    request through a real proxy (rewriting on) in front of a gated upstream."""
    monkeypatch.setenv("PG_TEST_ANTHROPIC_KEY", "sk-ant-backend-KEY")
    stack: list[Any] = []

    def run(events: list[bytes], api: str, model: str) -> int:
        up = GatedUpstream(events)
        up_cm = serve_app(up.app())
        up_url = up_cm.__enter__()
        stack.append(up_cm)
        policy = make_policy(up_url, tmp_path / "ledger.sqlite")
        proxy_cm = serve_app(build_app(policy, ledger=Ledger(policy.ledger.path)))
        url = proxy_cm.__enter__()
        stack.append(proxy_cm)
        body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": 32,
                                "messages": [{"role": "user", "content": "count"}]}
        path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
        text = ""
        splitter = EventSplitter()
        with httpx.Client(timeout=60) as c, c.stream("POST", url + path, json=body) as r:
            assert r.status_code == 200
            for piece in r.iter_raw():
                for ev in splitter.feed(piece):
                    text += _client_text(api, ev)
                    for i in range(N):
                        if _word(i) in text:
                            up.seen[i].set()
        assert text == "".join(_word(i) for i in range(N))
        return up.gate_timeouts

    yield run
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def test_passthrough_stream_reaches_the_client_event_by_event(through: Any) -> None:
    assert through(_openai_events(), "openai", "m") == 0


def test_anthropic_client_bridged_to_openai_backend_gets_events_one_by_one(through: Any) -> None:
    assert through(_openai_events(), "anthropic", "m") == 0


def test_openai_client_bridged_to_anthropic_backend_gets_events_one_by_one(through: Any) -> None:
    assert through(_anthropic_events(), "openai", "claude-x") == 0
