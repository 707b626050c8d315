"""The Responses -> Chat bridge object, point by point (issue 21): what it sends upstream (the
passes' bytes kept byte for byte, a model override, the O->A bridge under it on an Anthropic
backend), what it answers, and what it stores — a finished response with the items that led to
it, nothing when ``store: false``.

Drives :class:`~prefixgate.proxy.bridges.responses_chat.ResponsesToChat` as the pipeline does
(``bridge_for("responses", wire, responses=ResponsesState(...))``), without HTTP.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from prefixgate.proxy.bridges import ResponsesState, bridge_for
from prefixgate.proxy.bridges.responses_chat import ResponsesToChat
from prefixgate.proxy.bridges.responses_chat_items import to_chat
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import NestingTooDeep
from prefixgate.proxy.core.sse import SSEEvent, parse_event
from prefixgate.proxy.core.usage import AnthropicStreamWatcher, OpenAIStreamWatcher

HISTORY = [{"type": "message", "role": "user", "content": "one"},
           {"type": "message", "role": "assistant", "id": "msg_0", "status": "completed",
            "content": [{"type": "output_text", "text": "1", "annotations": [], "logprobs": []}]}]
BODY = {"model": "m", "input": "two", "instructions": "be brief", "max_output_tokens": 50}


@dataclass
class Out:
    body: dict[str, Any]
    raw: bytes


class Stored:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = []

    def __call__(self, rid: str, final: dict[str, Any], items: list[dict[str, Any]]) -> None:
        self.calls.append((rid, final, items))


def bridge(wire: str = "openai", body: dict[str, Any] | None = None, store: bool = True
           ) -> tuple[ResponsesToChat, Stored]:
    kept = Stored()
    b = bridge_for("responses", wire, responses=ResponsesState(body or BODY, list(HISTORY),  # type: ignore[arg-type]
                                                              kept if store else None))
    assert isinstance(b, ResponsesToChat)
    return b, kept


def events(mapper: Any, raws: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for raw in raws:
        for b in mapper(raw, parse_event(raw)):
            ev = parse_event(b)
            out.append(json.loads(ev.data or ""))
    return out


def chat_sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def test_the_bridge_speaks_chat_at_its_path_and_its_passes_read_the_chat_body() -> None:
    b, _ = bridge()
    assert (b.client, b.wire, b.path, b.pass_api, b.translate) == ("responses", "openai",
                                                                    "/chat/completions", "openai", True)
    assert b.url("http://h/v1") == "http://h/v1/chat/completions"
    assert b.items == HISTORY + [{"type": "message", "role": "user", "content": "two"}]
    chat = to_chat(BODY, HISTORY)
    assert chat["messages"][0] == {"role": "system", "content": "be brief"} and len(chat["messages"]) == 4
    assert b.pass_body(BODY) == chat and b.request(BODY, 64) == chat


def test_on_anthropic_it_speaks_messages_under_the_o_to_a_bridge() -> None:
    b, _ = bridge("anthropic")
    assert (b.client, b.wire, b.path, b.pass_api) == ("responses", "anthropic", "/messages", "openai")
    assert b.pass_body(BODY) == to_chat(BODY, HISTORY)  # the passes still read Chat
    msg = b.request(BODY, 64)
    assert msg["max_tokens"] == 50 and msg["model"] == "m"
    assert "be brief" in json.dumps(msg["system"]) and msg["messages"][-1]["role"] == "user"
    raw = json.loads(b.encode(BODY, b"", None, "claude-x", 64))
    assert raw["model"] == "claude-x" and raw["max_tokens"] == 50 and "messages" in raw
    rewritten = Out({**to_chat(BODY, HISTORY), "max_tokens": 7}, b"ignored")
    assert json.loads(b.encode(BODY, b"", rewritten, None, 64))["max_tokens"] == 7


def test_encode_keeps_the_passes_bytes_unless_the_model_changes() -> None:
    b, _ = bridge()
    assert json.loads(b.encode(BODY, b"client bytes", None, None, 64)) == to_chat(BODY, HISTORY)
    chat = {**to_chat(BODY, HISTORY), "prompt_cache_key": "k"}
    rewritten = Out(chat, b'{"exact":  "bytes"}')
    assert b.encode(BODY, b"client bytes", rewritten, None, 64) == b'{"exact":  "bytes"}'
    assert json.loads(b.encode(BODY, b"", rewritten, "m2", 64)) == {**chat, "model": "m2"}
    assert json.loads(b.encode(BODY, b"", None, "m2", 64))["model"] == "m2"


def test_a_non_streamed_answer_becomes_a_stored_response() -> None:
    b, kept = bridge()
    answer = {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "2"}}],
              "usage": {"prompt_tokens": 12, "completion_tokens": 1,
                        "prompt_tokens_details": {"cached_tokens": 8}}}
    raw, usage = b.answer(answer, b"", "m")
    final = json.loads(raw)
    assert final["object"] == "response" and final["id"].startswith("resp_") and final["status"] == "completed"
    assert isinstance(final["created_at"], int) and abs(final["created_at"] - time.time()) < 60
    assert [o["content"][0]["text"] for o in final["output"]] == ["2"]
    assert final["usage"]["input_tokens"] == 12 and final["usage"]["input_tokens_details"]["cached_tokens"] == 8
    assert final["max_output_tokens"] == 50 and final["instructions"] == "be brief"
    assert (usage.prompt_tokens, usage.cached_tokens, usage.output_tokens) == (12, 8, 1)
    assert kept.calls == [(final["id"], final, b.items)]


def test_engine_timings_fill_a_non_streamed_usage() -> None:
    b, _ = bridge()
    answer = {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}],
              "usage": {"completion_tokens": 3}, "timings": {"cache_n": 4, "prompt_n": 2}}
    final = json.loads(b.answer(answer, b"", "m")[0])
    assert final["status"] == "incomplete"
    assert final["usage"]["input_tokens"] == 6 and final["usage"]["input_tokens_details"]["cached_tokens"] == 4


def test_store_false_stores_nothing() -> None:
    b, kept = bridge(store=False)
    b.answer({"choices": [{"message": {"content": "x"}}]}, b"", "m")
    _, mapper = b.stream("m", {**BODY, "stream": True})
    assert mapper is not None
    events(mapper, [chat_sse({"choices": [{"delta": {"content": "x"}}]}), chat_sse(b"[DONE]")])
    assert kept.calls == []


def test_an_anthropic_answer_becomes_a_response() -> None:
    b, kept = bridge("anthropic")
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "stop_reason": "tool_use",
           "content": [{"type": "text", "text": "Checking."},
                       {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"a": 1}}],
           "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 10}}
    raw, usage = b.answer(msg, b"", "m")
    final = json.loads(raw)
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["call_id"] == "toolu_1" and json.loads(final["output"][1]["arguments"]) == {"a": 1}
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 10
    assert usage.output_tokens == 2 and kept.calls[0][1] == final


def test_a_chat_stream_maps_to_responses_events_and_is_stored_at_the_end() -> None:
    b, kept = bridge()
    assert b.end_mapper(OpenAIStreamWatcher()) is None  # before the stream starts
    watcher, mapper = b.stream("m", {**BODY, "stream": True})  # the client's body, as the pipeline passes it
    assert isinstance(watcher, OpenAIStreamWatcher) and mapper is not None
    assert b.end_mapper(watcher) == mapper
    evs = events(mapper, [chat_sse({"choices": [{"delta": {"content": "Hi"}}]})])
    assert [e["type"] for e in evs][:2] == ["response.created", "response.in_progress"]
    assert kept.calls == []  # not before it ends
    evs = events(mapper, [chat_sse(b"[DONE]")])
    final = evs[-1]["response"]
    assert evs[-1]["type"] == "response.completed" and final["id"].startswith("resp_")
    assert kept.calls == [(final["id"], final, b.items)]


def test_a_failed_stream_is_not_stored() -> None:
    b, kept = bridge()
    _, mapper = b.stream("m", {**BODY, "stream": True})
    evs = events(mapper, [chat_sse({"choices": [{"delta": {"content": "Hi"}}]}),
                          chat_sse({"error": {"message": "boom"}}), chat_sse(b"[DONE]")])
    assert evs[-1]["type"] == "response.failed" and kept.calls == []


def anthropic_sse(kind: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps({"type": kind, **obj}).encode() + b"\n\n"


def test_an_anthropic_stream_maps_through_chat_to_responses_events() -> None:
    b, kept = bridge("anthropic")
    # the client's Responses body asks for no usage chunk: the bridge asks the O->A bridge for it
    watcher, mapper = b.stream("m", {**BODY, "stream": True})
    assert isinstance(watcher, AnthropicStreamWatcher) and mapper is not None
    raws = [anthropic_sse("message_start", {"message": {"id": "msg_1", "usage": {
                "input_tokens": 7, "output_tokens": 0, "cache_read_input_tokens": 3}}}),
            anthropic_sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            anthropic_sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            anthropic_sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            anthropic_sse("content_block_stop", {"index": 0}),
            anthropic_sse("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
            anthropic_sse("message_stop", {})]
    out: list[dict[str, Any]] = []
    for raw in raws:
        ev = parse_event(raw)
        watcher.observe(ev)
        out += [json.loads(parse_event(x).data or "") for x in mapper(raw, ev)]
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    final = out[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"]["output_tokens"] == 2  # include_usage is asked of the O->A bridge
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 3
    assert kept.calls == [(final["id"], final, b.items)]


def test_tool_arguments_nested_past_the_limit_are_a_400_on_anthropic() -> None:
    deep = '{"a": {"b": {"c": {"d": 1}}}}'
    body = {"model": "m", "input": [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": deep},
        {"type": "function_call_output", "call_id": "c1", "output": "x"}]}
    b, _ = bridge("anthropic", body)
    for send in (lambda d: b.request(body, d), lambda d: b.encode(body, b"", None, None, d)):
        with pytest.raises(NestingTooDeep) as err:
            send(2)
        assert "nested more than 2 levels deep" in err.value.message
        send(64)  # within the limit: translated


def test_errors_are_mapped_by_the_o_to_a_bridge_only() -> None:
    b, _ = bridge()
    assert b.error(b'{"error": {"message": "x"}}', 500) is None
    a, _ = bridge("anthropic")
    err = a.error(b'{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}', 529)
    assert err is not None and json.loads(err) == {"error": {"message": "busy", "type": "overloaded_error",
                                                             "param": None, "code": None}}


def test_answers_are_read_with_their_numbers_kept() -> None:
    b, _ = bridge()
    got = b.loads(b'{"a": 1.10, "n": 12345678901234567890123}')
    assert got["n"] == 12345678901234567890123  # exact, not a float
    assert exactjson.dumps(got) == b'{"a":1.10,"n":12345678901234567890123}'  # the text kept


def test_a_chained_mapper_feeds_every_event_of_the_first_to_the_second() -> None:
    from prefixgate.proxy.bridges.responses_chat import _chained

    def first(raw: bytes, ev: SSEEvent) -> list[bytes]:
        assert raw == b"data: x\n\n"  # each mapper gets the event's bytes and its parse
        return [b"data: " + (ev.data or "").encode() + b"-" + str(i).encode() + b"\n\n" for i in range(2)]

    seen: list[tuple[bytes, str | None]] = []

    def second(raw: bytes, ev: SSEEvent) -> list[bytes]:
        seen.append((raw, ev.data))
        return [raw.upper()]

    both = _chained(first, second)
    assert both(b"data: x\n\n", SSEEvent("message", "x")) == [b"DATA: X-0\n\n", b"DATA: X-1\n\n"]
    assert seen == [(b"data: x-0\n\n", "x-0"), (b"data: x-1\n\n", "x-1")]


# ---- on an OpenAI backend (the Responses identity bridge): the client's cache key wins ----------

def test_a_clients_prompt_cache_key_is_never_overridden_on_an_openai_backend() -> None:
    """The passes may propose a ``prompt_cache_key`` / ``prompt_cache_retention``; a client that
    sent its own keeps it (its key names its own cache partition), one that sent none gets the
    proposal, and a body the passes left alone goes byte for byte."""
    ident = bridge_for("responses", "responses", responses=ResponsesState({"model": "gpt-x", "input": "hi"}))
    proposal = Out({"model": "gpt-x", "messages": [], "prompt_cache_key": "pg-proxy",
                    "prompt_cache_retention": "24h"}, b"")
    mine = {"model": "gpt-x", "input": "hi", "prompt_cache_key": "client-key",
            "prompt_cache_retention": "in_memory"}
    raw = b'{"model": "gpt-x", "input": "hi", "prompt_cache_key": "client-key", "prompt_cache_retention": "in_memory"}'
    assert ident.encode(mine, raw, proposal, None, 64) == raw
    sent = json.loads(ident.encode(mine, raw, proposal, "gpt-y", 64))
    assert (sent["prompt_cache_key"], sent["prompt_cache_retention"], sent["model"]) == (
        "client-key", "in_memory", "gpt-y")
    bare = {"model": "gpt-x", "input": "hi"}
    sent = json.loads(ident.encode(bare, b"{}", proposal, None, 64))
    assert (sent["prompt_cache_key"], sent["prompt_cache_retention"]) == ("pg-proxy", "24h")
