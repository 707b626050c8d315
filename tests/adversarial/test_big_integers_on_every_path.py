"""Integers beyond 64 bits keep their exact text on every path a body is serialised (issue 20,
class 11): not only the chat passthrough, but the fan-out gate's key, the exact count_tokens
path, and the stream events the bridges write from an upstream's answer.

orjson cannot write an integer beyond 64 bits; every serialiser of client- or upstream-derived
JSON goes through :func:`prefixgate.proxy.core.exactjson.dumps`. A path that called orjson
directly answers 500 (or breaks its stream) on these bodies.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.proxy.upstream import Script, chunk
from tests.servers import serve_app

BIG = "123456789012345678901234567890"  # beyond 64 bits
HUGE_NEG = "-98765432109876543210987654321"
USER = {"role": "user", "content": "hi"}


def _raw_post(url: str, path: str, text: str) -> httpx.Response:
    return httpx.post(url + path, content=text.encode(),
                      headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize("number", [BIG, HUGE_NEG])
def test_chat_with_the_fanout_gate_on_keeps_the_number(rig_factory: Any, number: str) -> None:
    rig = rig_factory(fanout={"enabled": True, "providers": ["radix"], "min_prefix_bytes": 0})
    rig.upstream.script = Script(body={"id": "c", "object": "chat.completion", "model": "m",
                                       "choices": [{"index": 0, "finish_reason": "stop",
                                                    "message": {"role": "assistant", "content": "ok"}}]})
    # the number sits in the part the gate keys on (tools), and outside it (metadata)
    text = (f'{{"model": "m", "metadata": {{"n": {number}}}, "tools": [{{"type": "function", "function": {{"name": '
            f'"f", "parameters": {{"type": "integer", "maximum": {number}}}}}}}], "messages": [{{"role": "system", '
            '"content": "s"}, {"role": "user", "content": "hi"}]}')
    r = _raw_post(rig.url, "/v1/chat/completions", text)
    assert r.status_code == 200, r.text
    assert number.encode() in rig.upstream.seen[-1].raw


def test_exact_count_tokens_keeps_the_number(rig_factory: Any) -> None:
    seen: list[bytes] = []

    async def tokenize(request: Request) -> Response:
        seen.append(await request.body())
        return JSONResponse({"count": 7, "tokens": [1] * 7})

    with serve_app(Starlette(routes=[Route("/tokenize", tokenize, methods=["POST"])])) as url:
        rig = rig_factory(backends={"e": {"kind": "openai_compat", "base_url": url + "/v1"}},
                          routes=[{"match": "*", "backend": "e"}])
        text = ('{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": '
                f'"t", "input_schema": {{"type": "integer", "maximum": {BIG}}}}}]}}')
        r = _raw_post(rig.url, "/v1/messages/count_tokens", text)
    assert r.status_code == 200, r.text
    assert r.json() == {"input_tokens": 7} and r.headers["x-prefixgate-token-count"] == "exact"
    assert BIG.encode() in seen[-1]


def _tool_call_stream(number: str) -> list[bytes]:
    first = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [
        {"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": ""}}]}}]}
    args = json.dumps({"index": 0, "function": {"arguments": f'{{"n": {number}}}'}})
    second = ('data: {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": '
              f'[{{"index": 0, "delta": {{"tool_calls": [{args}]}}}}]}}\n\n').encode()
    return [b"data: " + json.dumps(first).encode() + b"\n\n", second,
            chunk(finish="tool_calls"), b"data: [DONE]\n\n"]


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"model": "m", "max_tokens": 8, "stream": True, "messages": [USER]}),
    ("/v1/responses", {"model": "m", "stream": True, "input": "hi"}),
], ids=["anthropic-client-on-chat-backend", "responses-client-on-chat-backend"])
def test_bridged_streams_carry_an_upstream_number_exactly(rig: Any, path: str,
                                                          body: dict[str, Any]) -> None:
    rig.upstream.script = Script(pieces=_tool_call_stream(BIG))
    r = httpx.post(rig.url + path, json=body, timeout=30)
    assert r.status_code == 200
    assert BIG in r.text
    assert "event: error" not in r.text and "response.failed" not in r.text


def test_the_o2a_stream_carries_an_upstream_number_exactly(rig: Any) -> None:
    """An OpenAI client on an Anthropic backend whose tool input holds a big integer."""
    events = [
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
        b'"role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}\n\n',
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":'
        b'{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":'
        b'{"type":"input_json_delta","partial_json":"{\\"n\\": ' + BIG.encode() + b'}"}}\n\n',
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use"},'
        b'"usage":{"output_tokens":5}}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]
    rig.upstream.script = Script(pieces=events)
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "claude-x", "stream": True, "messages": [USER]})
    assert r.status_code == 200
    assert BIG in r.text and "[DONE]" in r.text
