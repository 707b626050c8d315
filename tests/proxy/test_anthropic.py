"""Anthropic Messages: pass-through streams (B07), the A->O bridge (B08, B18)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.proxy.bridges.anthropic_openai import StreamMapper, request_to_openai, response_to_anthropic
from prefixgate.proxy.core.sse import EventSplitter, parse_event
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
             "function": {"name": "calc", "arguments": '{"e":"2+2"}'}}]},
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
    assert out["messages"] == [{"role": "system", "content": [  # blocks stay parts, never glued
                                   {"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
                               {"role": "tool", "tool_call_id": "t1", "content": "3C"},
                               {"role": "user", "content": "Now a haiku."}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "calc"}}
    assert out["stop"] == ["END"]


def test_b08_non_stream_usage_mapping() -> None:
    resp = completion("hello", usage={"prompt_tokens": 12000, "completion_tokens": 40,
                                      "prompt_tokens_details": {"cached_tokens": 11008}})
    msg = response_to_anthropic(resp, "local")
    assert msg["usage"] == {"input_tokens": 992, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 11008, "output_tokens": 40,
                            "output_tokens_details": None, "server_tool_use": None,
                            "cache_creation": {"ephemeral_5m_input_tokens": 0,
                                               "ephemeral_1h_input_tokens": 0},
                            "inference_geo": None, "service_tier": None}
    assert msg["content"] == [{"type": "text", "text": "hello", "citations": None}]
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
                              "cache_read_input_tokens": 11008, "output_tokens": 40,
                              "output_tokens_details": None, "server_tool_use": None}
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
    assert start == {"type": "tool_use", "id": "call_1", "name": "calc", "input": {},
                     "caller": {"type": "direct"}}
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


# --- O->A: an OpenAI client whose model routes to an Anthropic backend -------------------------

def _anthropic_stream(read: int, write: int, text: str = "Hi") -> list[bytes]:
    objs = [
        {"type": "message_start", "message": {
            "id": "msg_9", "type": "message", "role": "assistant", "content": [], "model": "c",
            "usage": {"input_tokens": 5, "cache_creation_input_tokens": write,
                      "cache_read_input_tokens": read, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                              "partial_json": '{"e": "2+2"}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 9}},
        {"type": "message_stop"}]
    return [f"event: {o['type']}\ndata: {json.dumps(o)}\n\n".encode() for o in objs]


B07_BODY = {"model": "claude-x", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": [
                {"type": "text", "text": "static " * 300, "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "content": "hi"}]}


def test_b07_openai_client_to_anthropic_gets_cached_tokens_in_the_usage_chunk(rig: Any) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=rig.url + "/v1", api_key="sk-proxy-k", max_retries=0)
    rig.upstream.script = Script(pieces=_anthropic_stream(read=2048, write=0))
    kw = {k: v for k, v in B07_BODY.items() if k != "stream"}
    chunks = list(client.chat.completions.create(stream=True, **kw))
    sent = rig.upstream.seen[-1]
    assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == "sk-ant-backend-KEY"
    assert sent.json["system"][0]["cache_control"] == {"type": "ephemeral"}  # block list kept
    assert sent.json["messages"] == [{"role": "user", "content": [{"type": "text",
                                                                   "text": "hi"}]}]
    assert "stream_options" not in sent.json and sent.json["max_tokens"] == 4096
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens == 2048
    assert usage.prompt_tokens == 5 + 2048 + 0 and usage.completion_tokens == 9
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hi"
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id == "toolu_1" and calls[0].function.name == "calc"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"e": "2+2"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    row = wait_rows(rig.ledger, 1)[-1]
    assert (row["cached_tokens"], row["cache_write_tokens"], row["prompt_tokens"]) == (
        2048, 0, 2053)


def test_b07_stream_and_non_stream_report_the_same_numbers(rig: Any) -> None:
    msg = {"id": "msg_9", "type": "message", "role": "assistant", "model": "c",
           "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 5, "cache_creation_input_tokens": 100,
                     "cache_read_input_tokens": 2048, "output_tokens": 9}}
    rig.upstream.script = Script(body=msg)
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={**B07_BODY, "stream": False})
    full = r.json()
    assert full["choices"][0]["message"] == {"role": "assistant", "content": "Hi",
                                             "refusal": None, "annotations": []}
    assert full["usage"]["prompt_tokens"] == 5 + 100 + 2048
    assert full["usage"]["prompt_tokens_details"] == {"cached_tokens": 2048}
    assert r.headers["x-prefixgate-cached-tokens"] == "2048"
    rig.upstream.script = Script(pieces=_anthropic_stream(read=2048, write=100))
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30, json=B07_BODY)
    last = [json.loads(parse_event(e).data) for e in events_of(r.content)
            if parse_event(e).data != "[DONE]"][-1]
    assert last["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"]
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 2048}
    assert r.content.endswith(b"data: [DONE]\n\n")


def test_o2a_tool_loop_request_translation() -> None:
    from prefixgate.proxy.bridges.openai_anthropic import request_to_anthropic

    out = request_to_anthropic({"model": "claude-x", "max_tokens": 64, "stop": "END",
        "tools": [{"type": "function", "function": {"name": "calc", "parameters": {
            "type": "object", "properties": {"e": {"type": "string"}}}}}],
        "tool_choice": "required",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_9", "type": "function",
                 "function": {"name": "calc", "arguments": '{"e":"2+2"}'}}]},
            {"role": "tool", "tool_call_id": "call_9", "content": "4"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "thanks"}]})
    assert out["system"] == "sys" and out["stop_sequences"] == ["END"]
    assert out["tool_choice"] == {"type": "any"}
    assert out["tools"][0]["input_schema"]["properties"] == {"e": {"type": "string"}}
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_9", "name": "calc",
                                           "input": {"e": "2+2"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_9", "content": "4"},
            {"type": "text", "text": "thanks"}]}]  # empty assistant dropped, never an empty block
