"""Both bridges' answer mappings, one rule per test, on the mapping functions themselves.

Sources: the tables in ``prefixgate/proxy/bridges/anthropic_openai.py`` (A->O: OpenAI answers to an Anthropic
client) and ``prefixgate/proxy/bridges/openai_anthropic.py`` (O->A: Anthropic answers to an OpenAI client), rendered in
docs/bridges.md. Streams: parallel tool calls must keep each call's arguments with its own call.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from prefixgate.proxy.bridges.anthropic_openai import StreamMapper, response_to_anthropic
from prefixgate.proxy.bridges.openai_anthropic import ChunkMapper, response_to_openai
from prefixgate.proxy.core.sse import parse_event
from prefixgate.proxy.core.usage import AnthropicStreamWatcher


def _openai_answer(finish: str) -> dict[str, Any]:
    return {"id": "x", "choices": [{"index": 0, "finish_reason": finish,
                                    "message": {"role": "assistant", "content": "hi"}}]}


@pytest.mark.parametrize("finish,stop", [("stop", "end_turn"), ("length", "max_tokens"),
                                         ("tool_calls", "tool_use"),
                                         ("function_call", "tool_use")])
def test_a2o_finish_reason_maps_to_its_stop_reason(finish: str, stop: str) -> None:
    assert response_to_anthropic(_openai_answer(finish), "m")["stop_reason"] == stop


@pytest.mark.parametrize("stop,finish", [("end_turn", "stop"), ("stop_sequence", "stop"),
                                         ("max_tokens", "length"), ("tool_use", "tool_calls"),
                                         ("refusal", "content_filter")])
def test_o2a_stop_reason_maps_to_its_finish_reason_answer_and_stream(stop: str, finish: str) -> None:
    msg = {"id": "m1", "content": [{"type": "text", "text": "hi"}], "stop_reason": stop,
           "usage": {"input_tokens": 1, "output_tokens": 1}}
    assert response_to_openai(msg, "m")["choices"][0]["finish_reason"] == finish
    mapper = ChunkMapper("m", AnthropicStreamWatcher(), include_usage=False)
    ev = _anthropic_event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": stop}, "usage": {}})
    (out,) = mapper.map(ev, parse_event(ev))
    assert json.loads(out[len(b"data: "):])["choices"][0]["finish_reason"] == finish


def _openai_chunk(tool_calls: list[dict[str, Any]]) -> bytes:
    obj = {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": tool_calls},
                                   "finish_reason": None}]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _events(raw: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(e.split(b"data: ", 1)[1]) for e in raw]


def test_a2o_stream_parallel_tool_call_arguments_stay_with_their_call() -> None:
    mapper = StreamMapper("m")
    out: list[bytes] = []
    for tc in ([{"index": 0, "id": "call_a", "function": {"name": "fa", "arguments": ""}}],
               [{"index": 1, "id": "call_b", "function": {"name": "fb", "arguments": ""}}],
               [{"index": 0, "function": {"arguments": '{"a": 1}'}}],
               [{"index": 1, "function": {"arguments": '{"b": 2}'}}]):
        raw = _openai_chunk(tc)
        out += mapper.map(raw, parse_event(raw))
    out += mapper.map(b"data: [DONE]\n\n", parse_event(b"data: [DONE]\n\n"))
    evs = _events(out)
    ids = {e["index"]: e["content_block"]["id"] for e in evs if e["type"] == "content_block_start"}
    args: dict[str, str] = {}
    for e in evs:
        if e["type"] == "content_block_delta":
            args[ids[e["index"]]] = args.get(ids[e["index"]], "") + e["delta"]["partial_json"]
    assert args == {"call_a": '{"a": 1}', "call_b": '{"b": 2}'}


def _anthropic_event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def test_o2a_stream_tool_calls_get_distinct_indices_and_their_own_arguments() -> None:
    watcher = AnthropicStreamWatcher()
    mapper = ChunkMapper("m", watcher, include_usage=False)
    script: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {"id": "m1", "usage": {}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_a", "name": "fa", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": '{"a":1}'}}),
        ("content_block_start", {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "toolu_b", "name": "fb", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 2,
                                 "delta": {"type": "input_json_delta", "partial_json": '{"b":2}'}}),
    ]
    calls: list[dict[str, Any]] = []
    for name, obj in script:
        raw = _anthropic_event(name, obj)
        ev = parse_event(raw)
        watcher.observe(ev)
        for out in mapper.map(raw, ev):
            delta = json.loads(out[len(b"data: "):])["choices"][0]["delta"]
            calls += delta.get("tool_calls") or []
    by_index: dict[int, dict[str, str]] = {}
    for c in calls:
        slot = by_index.setdefault(c["index"], {"id": "", "arguments": ""})
        slot["id"] = c.get("id") or slot["id"]
        slot["arguments"] += c["function"]["arguments"]
    assert by_index == {0: {"id": "toolu_a", "arguments": '{"a":1}'},
                        1: {"id": "toolu_b", "arguments": '{"b":2}'}}
