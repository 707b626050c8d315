"""Anthropic Messages: pass-through streams (B07), the A->O bridge (B08, B18)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.bridge_anthropic import StreamMapper, request_to_openai, response_to_anthropic
from proxy.sse import EventSplitter, parse_event
from tests.paths import DATA
from tests.proxy.upstream import DONE, Script, chunk, completion, wait_rows

RECORDINGS = sorted((DATA / "sse" / "anthropic").glob("*.txt"))


def events_of(data: bytes) -> list[bytes]:
    s = EventSplitter()
    out = s.feed(data)
    tail = s.flush()
    return out + ([tail] if tail else [])


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_anthropic_recording_passes_through_byte_identical(rig: Any, path: Path) -> None:
    data = path.read_bytes()
    rig.upstream.script = Script(pieces=events_of(data), delay_s=0.002)
    with httpx.Client(timeout=30) as c:
        r = c.post(rig.url + "/v1/messages", json={
            "model": "claude-x", "max_tokens": 32, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.content == data
    row = wait_rows(rig.ledger, 1)[-1]
    assert row["status"] == "ok" and row["output_tokens"] is not None


def test_b07_cache_counts_merged_across_message_start_and_delta(rig: Any) -> None:
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "c",
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 2048, "output_tokens": 1}}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": 7}}
    ev = [f"event: {o['type']}\ndata: {json.dumps(o)}\n\n".encode() for o in (
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0}, delta, {"type": "message_stop"})]
    rig.upstream.script = Script(pieces=ev)
    r = httpx.post(rig.url + "/v1/messages", timeout=30, json={
        "model": "claude-x", "max_tokens": 32, "stream": True,
        "system": [{"type": "text", "text": "static", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.content == b"".join(ev)  # message_start keeps its cache fields
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["prompt_tokens"], row["cached_tokens"], row["cache_write_tokens"],
            row["output_tokens"]) == (12 + 2048, 2048, 0, 7)


def test_b18_tool_only_assistant_turn_translates_to_tool_calls_with_null_content() -> None:
    body = {"model": "local", "max_tokens": 128,
            "tools": [{"name": "calc", "input_schema": {"type": "object", "properties": {
                "e": {"type": "string"}}}}],
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9",
                                                   "name": "calc", "input": {"e": "2+2"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                              "content": "4"}]}]}
    out = request_to_openai(body)
    assert out["messages"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_9", "type": "function",
             "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_9", "content": "4"}]
    assert out["tools"][0]["function"]["parameters"]["properties"]["e"] == {"type": "string"}
    assert out["max_tokens"] == 128


def test_b18_tool_results_come_before_the_rest_of_the_user_turn() -> None:
    out = request_to_openai({"model": "m", "max_tokens": 8, "system": [
        {"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}], "messages": [
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text",
                                                                      "text": "3C"}]},
            {"type": "text", "text": "Now a haiku."}]}],
        "tool_choice": {"type": "tool", "name": "calc"}, "stop_sequences": ["END"]})
    assert out["messages"] == [{"role": "system", "content": "S1S2"},
                               {"role": "tool", "tool_call_id": "t1", "content": "3C"},
                               {"role": "user", "content": "Now a haiku."}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "calc"}}
    assert out["stop"] == ["END"]


def test_b08_non_stream_usage_mapping() -> None:
    resp = completion("hello", usage={"prompt_tokens": 12000, "completion_tokens": 40,
                                      "prompt_tokens_details": {"cached_tokens": 11008}})
    msg = response_to_anthropic(resp, "local")
    assert msg["usage"] == {"input_tokens": 992, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 11008, "output_tokens": 40}
    assert msg["content"] == [{"type": "text", "text": "hello"}]
    assert msg["stop_reason"] == "end_turn"


def test_b08_stream_usage_in_message_delta_through_the_proxy(rig: Any) -> None:
    usage = {"prompt_tokens": 12000, "completion_tokens": 40,
             "prompt_tokens_details": {"cached_tokens": 11008}}
    rig.upstream.script = Script(pieces=[chunk("Hel"), chunk("lo"), chunk(finish="stop"),
                                         chunk(usage=usage), DONE])
    r = httpx.post(rig.url + "/v1/messages", timeout=30, json={
        "model": "local", "max_tokens": 40, "stream": True, "system": "long static text",
        "messages": [{"role": "user", "content": "next"}]})
    sent = rig.upstream.seen[-1].json
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"][0] == {"role": "system", "content": "long static text"}
    events = [parse_event(e) for e in events_of(r.content)]
    names = [e.event for e in events]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    delta = json.loads(events[5].data)
    assert delta["usage"] == {"input_tokens": 992, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 11008, "output_tokens": 40}
    assert delta["delta"]["stop_reason"] == "end_turn"
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["prompt_tokens"], row["cached_tokens"]) == (12000, 11008)


def test_stream_mapper_turns_tool_call_deltas_into_tool_use_blocks() -> None:
    m = StreamMapper("local")
    first = {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "calc", "arguments": ""}}]}}]}
    out = m.map(b"", parse_event(b"data: " + json.dumps(first).encode() + b"\n\n"))
    out += m.map(b"", parse_event(chunk(tool_args='{"e":')))
    out += m.map(b"", parse_event(chunk(tool_args='"2"}')))
    out += m.map(b"", parse_event(chunk(finish="tool_calls")))
    out += m.map(b"", parse_event(DONE))
    evs = [json.loads(parse_event(e).data) for e in out]
    start = evs[1]["content_block"]
    assert start == {"type": "tool_use", "id": "call_1", "name": "calc", "input": {}}
    partial = "".join(e["delta"]["partial_json"] for e in evs
                      if e["type"] == "content_block_delta")
    assert json.loads(partial) == {"e": "2"}
    assert evs[-2]["delta"]["stop_reason"] == "tool_use"


def test_upstream_error_is_translated_to_anthropic_shape(rig: Any) -> None:
    rig.upstream.script = Script(body={"error": {"message": "context too long",
                                                 "type": "invalid_request_error",
                                                 "param": None, "code": None}}, status=400)
    r = httpx.post(rig.url + "/v1/messages", timeout=30, json={
        "model": "local", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "context too long"}}
