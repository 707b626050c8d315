"""Chat chunks -> Responses stream events, point by point (issue 21): the event order and
numbering a Responses client relies on, items in the order they began, a failed stream never
stored, the usage the client sees.

Each case drives :class:`~prefixgate.proxy.bridges.responses_chat_stream.ResponsesStream` with
Chat Completions chunks and reads back the SSE events it writes (OpenAI reference, "Streaming
events"; rules: the module docstring).
"""

from __future__ import annotations

import json
from typing import Any

from prefixgate.proxy.bridges.responses_chat_stream import ResponsesStream
from prefixgate.proxy.core.sse import SSEEvent, parse_event

BODY = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "get"}]}


def sse(raw: bytes) -> dict[str, Any]:
    """One written event -> its data object, checking the ``event:`` name matches its type."""
    text = raw.decode()
    assert text.endswith("\n\n") and text.count("\n\n") == 1
    ev = parse_event(raw)
    obj = json.loads(ev.data or "")
    assert ev.event == obj["type"]
    return obj


class Run:
    """A stream under test, with what it wrote and what it stored."""

    def __init__(self, body: dict[str, Any] | None = None) -> None:
        self.stored: list[dict[str, Any]] = []
        self.s = ResponsesStream(body or BODY, "resp_1", on_done=self.stored.append, created_at=1700)
        self.events: list[dict[str, Any]] = []

    def feed(self, *chunks: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for c in chunks:
            data = c if isinstance(c, str) or c is None else json.dumps(c)
            out += [sse(b) for b in self.s.map(b"", SSEEvent("message", data))]
        self.events += out
        return out

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


def delta(**d: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def finish(reason: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def tc(index: int | None = None, id: str | None = None, name: str | None = None,
       args: str | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    out: dict[str, Any] = {"function": fn}
    if index is not None:
        out["index"] = index
    if id is not None:
        out["id"] = id
    return delta(tool_calls=[out])


def test_text_stream_events_in_order_numbered_from_zero() -> None:
    r = Run()
    first = r.feed(delta(role="assistant", content="Hel"))
    assert [e["type"] for e in first] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta"]
    r.feed(delta(content="lo"), finish("stop"), "[DONE]")
    assert r.types() == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in r.events] == list(range(len(r.events)))
    created, progress, added, part, d1, d2, tdone, pdone, idone, completed = r.events
    for e in (created, progress):
        assert e["response"]["status"] == "in_progress" and e["response"]["id"] == "resp_1"
        assert e["response"]["output"] == [] and e["response"]["created_at"] == 1700
        assert e["response"]["completed_at"] is None
    msg_id = added["item"]["id"]
    assert msg_id.startswith("msg_") and added["output_index"] == 0
    assert added["item"] == {"type": "message", "id": msg_id, "status": "in_progress",
                             "role": "assistant", "content": []}
    assert part == {"type": "response.content_part.added", "sequence_number": 3, "item_id": msg_id,
                    "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}
    assert d1 == {"type": "response.output_text.delta", "sequence_number": 4, "item_id": msg_id,
                  "output_index": 0, "content_index": 0, "delta": "Hel", "logprobs": []}
    assert d2["delta"] == "lo"
    assert tdone == {"type": "response.output_text.done", "sequence_number": 6, "item_id": msg_id,
                     "output_index": 0, "content_index": 0, "text": "Hello", "logprobs": []}
    assert pdone["part"]["text"] == "Hello" and pdone["item_id"] == msg_id and pdone["output_index"] == 0
    assert pdone["content_index"] == 0
    item = {"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]}
    assert idone["item"] == item and idone["output_index"] == 0
    final = completed["response"]
    assert final["status"] == "completed" and final["output"] == [item]
    assert final["incomplete_details"] is None and isinstance(final["completed_at"], int)
    assert r.stored == [final]


def test_tool_calls_stream_as_function_call_items_after_the_text() -> None:
    r = Run()
    r.feed(delta(content="Let me check."),
           tc(0, "call_a", "get", '{"ci'), tc(0, args='ty": "Oslo"}'),
           tc(1, "call_b", "get"),
           finish("tool_calls"), "[DONE]")
    assert r.types() == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_item.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    ev = r.events
    a_added, b_added = ev[5], ev[8]
    a_id = a_added["item"]["id"]
    assert a_id.startswith("fc_") and a_added["output_index"] == 1 and b_added["output_index"] == 2
    assert a_added["item"] == {"type": "function_call", "id": a_id, "call_id": "call_a", "name": "get",
                               "arguments": "", "status": "in_progress"}
    assert ev[6] == {"type": "response.function_call_arguments.delta", "sequence_number": 6,
                     "item_id": a_id, "output_index": 1, "delta": '{"ci'}
    assert ev[12] == {"type": "response.function_call_arguments.done", "sequence_number": 12,
                      "item_id": a_id, "output_index": 1, "arguments": '{"city": "Oslo"}', "name": "get"}
    assert ev[13]["item"]["arguments"] == '{"city": "Oslo"}' and ev[13]["output_index"] == 1
    assert ev[14]["arguments"] == "{}" and ev[15]["item"]["call_id"] == "call_b"  # no arguments: {}
    out = ev[-1]["response"]["output"]
    assert [o["type"] for o in out] == ["message", "function_call", "function_call"]
    assert [o.get("call_id") for o in out[1:]] == ["call_a", "call_b"]
    assert out[1]["status"] == "completed"
    assert r.stored[0]["output"] == out


def test_final_output_follows_the_order_items_began() -> None:
    """A call that began before the text is output 0, the text 1, in the events and in the
    stored response."""
    r = Run()
    r.feed(tc(name="get", args="{}"), delta(content="Done."), "[DONE]")
    adds = [e for e in r.events if e["type"] == "response.output_item.added"]
    assert [(e["item"]["type"], e["output_index"]) for e in adds] == [("function_call", 0), ("message", 1)]
    assert adds[0]["item"]["call_id"].startswith("call_")  # no id upstream: one is made
    out = r.events[-1]["response"]["output"]
    assert [o["type"] for o in out] == ["function_call", "message"]
    assert r.stored[0]["output"] == out


def test_reasoning_is_one_item_added_first_and_done_whole() -> None:
    r = Run()
    r.feed(delta(reasoning_content="Think"), delta(reasoning="ing."), delta(reasoning_content=""),
           delta(content="Hi"), "[DONE]")
    assert r.types() == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_item.done", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    added = r.events[2]
    rs_id = added["item"]["id"]
    assert rs_id.startswith("rs_") and added["output_index"] == 0
    assert added["item"] == {"type": "reasoning", "id": rs_id, "summary": [],
                             "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
    assert r.events[3]["output_index"] == 1
    done = r.events[6]
    assert done["output_index"] == 0
    assert done["item"]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    assert done["item"]["status"] == "completed"
    assert [o["type"] for o in r.events[-1]["response"]["output"]] == ["reasoning", "message"]


def test_a_refusal_streams_as_text() -> None:
    r = Run()
    r.feed(delta(refusal="I can't."), delta(content=None, refusal=None), "[DONE]")
    assert [e["delta"] for e in r.events if e["type"] == "response.output_text.delta"] == ["I can't."]
    assert r.events[-1]["response"]["output"][0]["content"][0]["text"] == "I can't."


def test_length_cap_ends_incomplete_and_is_stored() -> None:
    r = Run()
    r.feed(delta(content="a"), finish("length"), "[DONE]")
    assert r.types()[-1] == "response.incomplete"
    final = r.events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r.stored == [final]


def test_usage_chunk_becomes_the_final_usage() -> None:
    r = Run()
    r.feed(delta(content="a"),
           {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3,
                                     "prompt_tokens_details": {"cached_tokens": 8},
                                     "completion_tokens_details": {"reasoning_tokens": 1}}},
           "[DONE]")
    assert r.events[-1]["response"]["usage"] == {
        "input_tokens": 11, "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 14}


def test_engine_timings_fill_the_usage_and_a_later_chunk_keeps_the_last_usage() -> None:
    r = Run()
    r.feed({"choices": [], "usage": {"completion_tokens": 2}},
           {"choices": [], "timings": {"cache_n": 5, "prompt_n": 3}},
           "[DONE]")
    usage = r.events[-1]["response"]["usage"]
    assert usage["input_tokens"] == 8 and usage["input_tokens_details"]["cached_tokens"] == 5
    assert usage["output_tokens"] == 2
    r2 = Run()
    r2.feed({"choices": [], "sglext": {"cached_tokens_details": {"device": 4}},
             "usage": {"prompt_tokens": 9}}, "[DONE]")
    assert r2.events[-1]["response"]["usage"]["input_tokens"] == 9


def test_no_usage_upstream_reports_zeros_not_null() -> None:
    r = Run()
    r.feed(delta(content="a"), "[DONE]")
    assert r.events[-1]["response"]["usage"] == {
        "input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}


def test_done_alone_still_opens_and_completes_the_response() -> None:
    r = Run()
    r.feed(" [DONE] ")
    assert r.types() == ["response.created", "response.in_progress", "response.completed"]
    assert [e["sequence_number"] for e in r.events] == [0, 1, 2]
    assert r.events[-1]["response"]["output"] == [] and len(r.stored) == 1


def test_an_upstream_error_fails_the_response_and_nothing_is_stored() -> None:
    r = Run()
    r.feed(delta(content="par"), {"error": {"message": "overloaded", "type": "server_error"}})
    assert r.types()[-1] == "response.failed"
    failed = r.events[-1]
    assert failed["sequence_number"] == len(r.events) - 1
    assert failed["response"]["status"] == "failed" and failed["response"]["id"] == "resp_1"
    assert failed["response"]["error"] == {"code": "server_error", "message": "overloaded"}
    assert r.types().count("response.created") == 1
    assert r.feed("[DONE]") == [] and r.feed(delta(content="more")) == []  # finished: no more events
    assert r.stored == []


def test_an_error_first_opens_the_response_then_fails_it() -> None:
    r = Run()
    r.feed({"error": "x" * 3000})
    assert r.types() == ["response.created", "response.in_progress", "response.failed"]
    assert r.events[-1]["response"]["error"]["message"] == "x" * 2000
    r2 = Run()
    r2.feed({"error": {"code": 1}})
    assert r2.events[-1]["response"]["error"]["message"] == "upstream error"
    assert r.stored == [] and r2.stored == []


def test_an_error_beside_choices_is_not_a_failure() -> None:
    r = Run()
    r.feed({"error": "ignored", "choices": [{"index": 0, "delta": {"content": "ok"}}]}, "[DONE]")
    assert r.types()[-1] == "response.completed" and len(r.stored) == 1


def test_events_without_data_or_json_write_nothing() -> None:
    r = Run()
    assert r.feed(None, "not json", "[1, 2]", '"text"') == []
    assert not r.s.started
    r.feed(delta(content="a"), "[DONE]")
    assert r.feed("[DONE]") == [] and len(r.stored) == 1


def test_no_on_done_is_fine() -> None:
    s = ResponsesStream(BODY, "resp_x")
    out = s.map(b"", SSEEvent("message", "[DONE]"))
    assert sse(out[-1])["response"]["status"] == "completed"


def test_a_continuation_chunk_without_index_belongs_to_call_zero() -> None:
    """Chat streams may leave ``index`` out of a call's later chunks: they are call 0's."""
    r = Run()
    r.feed(tc(0, "call_a", "get", '{"a'), tc(args='": 1}'), "[DONE]")
    calls = [o for o in r.events[-1]["response"]["output"] if o["type"] == "function_call"]
    assert [(c["call_id"], c["arguments"]) for c in calls] == [("call_a", '{"a": 1}')]


def test_a_call_without_a_name_keeps_an_empty_name() -> None:
    r = Run()
    r.feed(tc(0, "call_a", args="{}"), "[DONE]")
    added = [e for e in r.events if e["type"] == "response.output_item.added"][0]
    assert added["item"]["name"] == "" and r.events[-1]["response"]["output"][0]["name"] == ""


def test_done_items_keep_the_ids_and_names_they_were_added_with() -> None:
    r = Run()
    r.feed(delta(reasoning_content="hm"), tc(0, "call_a", "get", "{}"), "[DONE]")
    added = {e["output_index"]: e["item"] for e in r.events if e["type"] == "response.output_item.added"}
    done = {e["output_index"]: e["item"] for e in r.events if e["type"] == "response.output_item.done"}
    assert [done[i]["id"] for i in (0, 1)] == [added[0]["id"], added[1]["id"]]
    assert done[1]["name"] == "get" and done[1]["call_id"] == "call_a"
    assert [o["id"] for o in r.events[-1]["response"]["output"]] == [added[0]["id"], added[1]["id"]]


def test_output_indexes_count_every_item_whatever_opens_first() -> None:
    r = Run()
    r.feed(tc(0, "call_a", "get", "{}"), delta(reasoning_content="hm"), delta(content="so"),
           tc(1, "call_b", "get", "{}"), "[DONE]")
    adds = [(e["item"]["type"], e["output_index"]) for e in r.events if e["type"] == "response.output_item.added"]
    assert adds == [("function_call", 0), ("reasoning", 1), ("message", 2), ("function_call", 3)]
    assert [o["type"] for o in r.events[-1]["response"]["output"]] == [
        "function_call", "reasoning", "message", "function_call"]


def test_a_first_chunk_with_calls_keeps_every_event() -> None:
    """Two calls in one chunk (and the response's opening events before them) all go out."""
    r = Run()
    first = r.feed({"choices": [{"index": 0, "delta": {"content": "x", "tool_calls": [
        {"index": 0, "id": "call_a", "function": {"name": "get", "arguments": "{}"}},
        {"index": 1, "id": "call_b", "function": {"name": "put", "arguments": "{}"}}]}}]})
    assert [e["type"] for e in first] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.output_item.added", "response.function_call_arguments.delta"]


def test_empty_or_non_text_reasoning_opens_no_reasoning_item() -> None:
    r = Run()
    r.feed(delta(reasoning_content="", reasoning="", content="hi"), delta(reasoning={"text": "x"}), "[DONE]")
    assert [o["type"] for o in r.events[-1]["response"]["output"]] == ["message"]


def test_an_sglang_cached_count_alone_fills_the_usage() -> None:
    r = Run()
    r.feed({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
           {"choices": [], "sglext": {"cached_tokens_details": {"device": 4, "host": 2}}}, "[DONE]")
    usage = r.events[-1]["response"]["usage"]
    assert usage["input_tokens"] == 9 and usage["input_tokens_details"]["cached_tokens"] == 6
