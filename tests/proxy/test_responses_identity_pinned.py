"""The Responses identity bridge at its edges (:mod:`prefixgate.proxy.bridges.responses_identity`;
issue 38: the tests vary what a rule is about).

The dimensions varied: the input excerpt's length at and around ``VIEW_INPUT_CHARS`` (a string,
items whose texts cross the bound, items past it, blocks, non-dict items), the usage's number
types (int, bool, float, missing), the stream's events (their order, sequence numbers out of
order or not integers, terminal kinds, errors, deltas), which tools a view carries (all
functions, a mix, none, instructions only) and what ``encode`` writes back (tools, each cache
parameter, one the client set itself, a model), and the response ids kept (a stored answer, a
stream by its end status).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.proxy.bridges.responses_identity import (
    VIEW_INPUT_CHARS,
    ResponsesIdentity,
    ResponsesWatcher,
    _input_excerpt,
    responses_usage,
)
from prefixgate.proxy.core.sse import SSEEvent

N = VIEW_INPUT_CHARS


# --- the input excerpt ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, N - 1, N, N + 1, 3 * N])
def test_a_string_input_is_cut_at_the_bound(n: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(n))
    assert _input_excerpt(text) == (text[:N] or ".")


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, N + 10), max_size=5), key=st.sampled_from(["content", "output", "arguments"]))
def test_item_texts_are_joined_and_cut_at_the_bound(sizes: list[int], key: str) -> None:
    items = [{"type": "x", key: chr(ord("a") + i) * n} for i, n in enumerate(sizes)]
    texts, seen = [], 0
    for i, n in enumerate(sizes):                  # the rule: each text cut to what is left
        if seen >= N:
            break
        if n:
            texts.append((chr(ord("a") + i) * n)[:N - seen])
            seen += len(texts[-1])
    assert _input_excerpt(items) == (" ".join(texts)[:N] or ".")


def test_block_texts_count_and_other_items_do_not() -> None:
    items: list[Any] = ["loose", 3, {"content": [{"type": "input_text", "text": "hi"}, "x",
                                                 {"type": "input_image"}, {"text": "there"}]},
                       {"output": "out", "arguments": '{"a": 1}'}]
    assert _input_excerpt(items) == "hi  there out {\"a\": 1}"
    assert _input_excerpt([]) == "." and _input_excerpt(None) == "." and _input_excerpt("") == "."


class _Item(dict):  # type: ignore[type-arg]
    """An input item that records whether it was read."""

    read = False

    def get(self, *args: Any) -> Any:
        self.read = True
        return super().get(*args)


@pytest.mark.parametrize("first", [N, N - 3])
def test_an_item_after_the_bound_is_not_read(first: int) -> None:
    """The walk stops once the texts read reach the bound: a huge input is never read whole."""
    items = [_Item(content="a" * first), _Item(content="b" * 10), _Item(content="c" * 5)]
    want = "a" * N if first == N else "a" * first + " bb"
    assert _input_excerpt(items) == want
    assert [i.read for i in items] == [True, first < N, False]


# --- usage and the stream's events ------------------------------------------------------------

@pytest.mark.parametrize("value, counted", [(7, 7), (0, 0), (True, None), (7.0, None), ("7", None), (None, None)])
def test_usage_takes_integers_only(value: Any, counted: int | None) -> None:
    u = responses_usage({"input_tokens": value, "output_tokens": value,
                         "input_tokens_details": {"cached_tokens": value, "span_reused_tokens": value}})
    assert (u.prompt_tokens, u.output_tokens, u.cached_tokens, u.span_reused_tokens) == (counted,) * 4
    assert responses_usage(None).prompt_tokens is None
    assert responses_usage({"input_tokens": 5, "input_tokens_details": 3}).cached_tokens is None


def _ev(obj: Any, event: str = "message") -> SSEEvent:
    return SSEEvent(event, None if obj is None else json.dumps(obj))


def test_the_watcher_counts_deltas_terminal_events_and_errors() -> None:
    w = ResponsesWatcher()
    assert w.last_seq == -1 and w.response_id == ""
    events = [
        ({"type": "response.created", "response": {"id": "resp_1"}, "sequence_number": 0}, False),
        ({"type": "response.output_text.delta", "delta": "a", "sequence_number": 3}, True),
        ({"type": "response.function_call_arguments.delta", "sequence_number": 2}, True),
        ({"type": "response.output_text.done", "sequence_number": True}, False),
        ({"type": "response.failed", "sequence_number": 4.5}, False),
        ({"type": "error"}, False),
        ({"type": "response.incomplete", "response": {"usage": {"input_tokens": 9}}}, False),
        ({"type": "response.completed", "response": {
            "usage": {"output_tokens": 4},
            "prompt_cache_diagnostics": {"type": "cache_miss", "reason": "prefix_changed"}}}, False),
    ]
    for obj, content in events:
        assert w.observe(_ev(obj)) is content
    assert (w.deltas, w.done, w.errors, w.response_id, w.last_seq) == (2, 2, 2, "resp_1", 3)
    assert (w.usage.prompt_tokens, w.usage.output_tokens, w.usage.miss_reason) == (9, 4, "prefix_changed")


def test_the_watcher_reads_the_event_name_when_the_data_has_no_type() -> None:
    w = ResponsesWatcher()
    assert w.observe(_ev({"delta": "x"}, "response.output_text.delta")) is True
    assert w.observe(_ev([1, 2], "response.reasoning.delta")) is True
    assert w.observe(_ev(None, "error")) is False and w.errors == 1
    assert w.observe(SSEEvent("message", "{not json")) is False
    assert w.observe(_ev({"type": "response.created"})) is False and w.response_id == ""
    assert w.observe(_ev({"type": "response.completed"})) is False and w.done == 1
    assert w.deltas == 2


# --- the pass view and what encode writes back ------------------------------------------------

def test_the_view_carries_function_tools_only_when_every_tool_is_one() -> None:
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    b = ResponsesIdentity()
    view = b.pass_body({"model": "m", "instructions": "be brief", "input": "hi", "tools": [fn]})
    assert view == {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    mixed = b.pass_body({"model": "m", "input": "hi", "tools": [fn, {"type": "web_search"}]})
    assert mixed is not None and "tools" not in mixed and mixed["messages"][0]["content"] == ""
    assert "tools" not in (b.pass_body({"model": "m", "input": "hi", "tools": []}) or {"tools": 1})
    assert b.pass_body({"model": "m", "input": "hi", "instructions": "x"}) is not None
    assert b.pass_body({"model": "m", "input": "hi"}) is None
    assert b.pass_body({"model": "m", "input": "hi", "tools": "web"}) is None
    assert (b.client, b.wire, b.path, b.pass_api) == ("responses", "responses", "/responses", "openai")


def _rewritten(body: dict[str, Any]) -> Any:
    return SimpleNamespace(body=body, raw=orjson.dumps(body))


@pytest.mark.parametrize("key", ["prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"])
def test_encode_writes_back_each_cache_parameter_the_client_did_not_set(key: str) -> None:
    body = {"model": "m", "input": "hi", "instructions": "x"}
    raw = orjson.dumps(body)
    b = ResponsesIdentity()
    out = json.loads(b.encode(body, raw, _rewritten({"messages": [], key: "v"}), None, 64))
    assert out == {**body, key: "v"}
    mine = {**body, key: "client's"}
    assert b.encode(mine, orjson.dumps(mine), _rewritten({key: "v"}), None, 64) == orjson.dumps(mine)


def test_encode_writes_back_the_tools_and_the_model_and_else_keeps_the_bytes() -> None:
    body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "b"},
                                                   {"type": "function", "name": "a"}]}
    raw = b'{"model": "m",  "input": "hi", "tools": []}'   # the client's own bytes
    b = ResponsesIdentity()
    canon = _rewritten({"tools": [{"type": "function", "function": {"name": "a"}},
                                  {"type": "function", "function": {"name": "b"}}]})
    out = json.loads(b.encode(body, raw, canon, None, 64))
    assert out["tools"] == [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}]
    assert b.encode(body, raw, None, None, 64) == raw
    assert b.encode(body, raw, _rewritten({"messages": []}), None, 64) == raw
    assert json.loads(b.encode(body, raw, None, "other", 64))["model"] == "other"
    no_tools = {"model": "m", "input": "hi"}
    assert b.encode(no_tools, raw, canon, None, 64) == raw     # tools only where the client sent a list


# --- the ids kept -------------------------------------------------------------------------------

def test_a_stored_answer_and_a_completed_stream_keep_their_ids() -> None:
    kept: list[str] = []
    b = ResponsesIdentity(kept.append)
    content = (b'{"id": "resp_a", "usage": {"input_tokens": 3}, '
               b'"prompt_cache_diagnostics": {"type": "cache_miss", "reason": "prefix_changed"}}')
    out, usage = b.answer(orjson.loads(content), content, "m")
    assert out == content and kept == ["resp_a"]
    assert (usage.prompt_tokens, usage.miss_reason) == (3, "prefix_changed")
    b.answer({"id": 5}, b"{}", "m")
    w = ResponsesWatcher()
    w.observe(_ev({"type": "response.created", "response": {"id": "resp_b"}}))
    for status in ("upstream_error", "client_disconnect"):
        b.stream_done(w, status)
    assert kept == ["resp_a"]
    b.stream_done(ResponsesWatcher(), "ok")                 # no id seen: nothing kept
    b.stream_done(w, "ok")
    assert kept == ["resp_a", "resp_b"]
    ResponsesIdentity().stream_done(w, "ok")                # store: false: no keeper


def test_the_relays_closing_error_becomes_a_responses_error_event_after_the_last_sequence() -> None:
    w = ResponsesWatcher()
    w.observe(_ev({"type": "response.output_text.delta", "sequence_number": 6}))
    end = ResponsesIdentity().end_mapper(w)
    assert end is not None
    data = json.dumps({"error": {"code": "upstream_error", "message": "broke", "param": "input"}})
    (frame,) = end(b"", SSEEvent("message", data))
    assert frame.startswith(b"event: error\ndata: ") and frame.endswith(b"\n\n")
    assert json.loads(frame[len(b"event: error\ndata: "):]) == {
        "type": "error", "code": "upstream_error", "message": "broke", "param": "input", "sequence_number": 7}
    (bare,) = end(b"", SSEEvent("message", None))
    assert json.loads(bare[len(b"event: error\ndata: "):]) == {
        "type": "error", "code": None, "message": "", "param": None, "sequence_number": 7}
    watcher, mapper = ResponsesIdentity().stream("m", {})
    assert isinstance(watcher, ResponsesWatcher) and mapper is None
