"""The Responses API: real `openai` clients by base_url, bridged to a scripted Chat Completions
upstream (function calls, previous_response_id, store: false), passed through to an OpenAI
backend, and bridged to an Anthropic backend."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.proxy.upstream import DONE, Script, chunk, completion

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]


def _client(rig: Any) -> OpenAI:
    return OpenAI(base_url=rig.url + "/v1", api_key="sk-proxy", max_retries=0)


def _call_answer() -> dict[str, Any]:
    body = completion("")
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    return body


def test_create_bridges_to_chat_and_back(rig: Any) -> None:
    rig.upstream.script = Script(body=completion("Hello!", usage={
        "prompt_tokens": 30, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 16}}))
    r = _client(rig).responses.create(model="m1", instructions="Be brief.", input="Hi",
                                      max_output_tokens=20, temperature=0)
    assert r.output_text == "Hello!" and r.status == "completed"
    assert r.usage.input_tokens == 30 and r.usage.input_tokens_details.cached_tokens == 16
    sent = rig.upstream.seen[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["messages"] == [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hi"}]
    assert sent.json["max_tokens"] == 20 and sent.json["temperature"] == 0
    row = rig.ledger.rows()[-1]
    assert (row["endpoint"], row["status"], row["prompt_tokens"]) == ("/v1/responses", "ok", 30)


def test_function_call_round_trip_with_previous_response_id(rig: Any) -> None:
    client = _client(rig)
    rig.upstream.script = Script(body=_call_answer())
    first = client.responses.create(model="m1", input="Weather in Oslo?", tools=TOOLS)
    call = first.output[0]
    assert (call.type, call.name, call.call_id, json.loads(call.arguments)) == (
        "function_call", "get_weather", "call_7", {"city": "Oslo"})
    assert rig.upstream.seen[-1].json["tools"][0]["function"]["name"] == "get_weather"
    rig.upstream.script = Script(body=completion("It is 4 degrees."))
    second = client.responses.create(
        model="m1", previous_response_id=first.id, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": "call_7", "output": "4C"}])
    assert second.output_text == "It is 4 degrees."
    assert second.previous_response_id == first.id
    msgs = rig.upstream.seen[-1].json["messages"]
    assert msgs == [{"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_7", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                    {"role": "tool", "tool_call_id": "call_7", "content": "4C"}]
    got = client.responses.retrieve(second.id)
    assert got.output_text == "It is 4 degrees."
    client.responses.delete(second.id)
    with pytest.raises(Exception) as e:
        client.responses.retrieve(second.id)
    assert getattr(e.value, "status_code", None) == 404


def test_store_false_is_not_kept_and_an_unknown_previous_id_is_a_404(rig: Any) -> None:
    client = _client(rig)
    rig.upstream.script = Script(body=completion("x"))
    r = client.responses.create(model="m1", input="a", store=False)
    assert r.store is False
    resp = httpx.get(f"{rig.url}/v1/responses/{r.id}", timeout=10)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    resp = httpx.post(rig.url + "/v1/responses", timeout=10, json={
        "model": "m1", "input": "b", "previous_response_id": r.id})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "previous_response_not_found"


def test_stream_maps_chunks_to_response_events_in_order(rig: Any) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    rig.upstream.script = Script(pieces=[chunk("Hel"), chunk("lo"), chunk(finish="stop"),
                                         chunk(usage=usage), DONE])
    client = _client(rig)
    with client.responses.stream(model="m1", input="Say hello") as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_response()
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta",
                     "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert final.output_text == "Hello" and final.usage.output_tokens == 2
    assert rig.upstream.seen[-1].json["stream_options"] == {"include_usage": True}
    # the streamed response is stored: a follow-up continues from it
    rig.upstream.script = Script(pieces=[chunk("Again"), chunk(finish="stop"), DONE])
    with client.responses.stream(model="m1", input="More", previous_response_id=final.id) as s2:
        text = "".join(ev.delta for ev in s2 if ev.type == "response.output_text.delta")
    assert text == "Again"
    assert [m["content"] for m in rig.upstream.seen[-1].json["messages"]] == [
        "Say hello", "Hello", "More"]


def test_streamed_tool_call_becomes_function_call_items(rig: Any) -> None:
    def tc(i: int, **fn: Any) -> bytes:
        obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                   {"index": i, **({"id": "call_1", "type": "function"} if "name" in fn else {}),
                    "function": fn}]}}]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"
    rig.upstream.script = Script(pieces=[tc(0, name="get_weather", arguments=""),
                                         tc(0, arguments='{"city":'), tc(0, arguments='"Rome"}'),
                                         chunk(finish="tool_calls"), DONE])
    with _client(rig).responses.stream(model="m1", input="x", tools=TOOLS) as stream:
        final = stream.get_final_response()
    (item,) = final.output
    assert (item.type, item.call_id, item.arguments) == ("function_call", "call_1",
                                                          '{"city":"Rome"}')


def test_builtin_tools_are_refused_with_a_400_naming_them(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/responses", timeout=10, json={
        "model": "m1", "input": "x", "tools": [{"type": "web_search"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].type"
    assert rig.upstream.seen == []


def test_passthrough_to_an_openai_backend_keeps_the_body_and_routes_get(
        rig_factory: Any, upstream: Any) -> None:
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    answer = {"id": "resp_up1", "object": "response", "status": "completed", "model": "gpt-x",
              "output": [], "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6,
                                      "input_tokens_details": {"cached_tokens": 4}}}
    rig.upstream.script = Script(body=answer)
    body = {"model": "gpt-x", "input": "hi", "max_output_tokens": 5}
    r = httpx.post(rig.url + "/v1/responses", json=body, timeout=10)
    assert r.json()["id"] == "resp_up1"
    assert rig.upstream.seen[-1].path == "/v1/responses"
    assert rig.upstream.seen[-1].json == body
    assert rig.ledger.rows()[-1]["cached_tokens"] == 4
    httpx.get(rig.url + "/v1/responses/resp_up1", timeout=10)
    assert rig.upstream.seen[-1].path == "/v1/responses/resp_up1"


def test_bridged_to_an_anthropic_backend(rig: Any) -> None:
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "c",
           "content": [{"type": "text", "text": "Bonjour"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 7, "output_tokens": 2}}
    rig.upstream.script = Script(body=msg)
    r = _client(rig).responses.create(model="claude-x", input="Hello in French",
                                      instructions="Translate.")
    assert r.output_text == "Bonjour" and r.usage.input_tokens == 7
    sent = rig.upstream.seen[-1]
    assert sent.path == "/v1/messages" and sent.json["system"] == "Translate."
    assert sent.json["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Hello in French"}]}]


def test_streamed_from_an_anthropic_backend(rig: Any) -> None:
    def ev(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
    rig.upstream.script = Script(pieces=[
        ev("message_start", {"message": {"id": "msg_2", "usage": {"input_tokens": 4,
                                                                  "output_tokens": 0}}}),
        ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Oui"}}),
        ev("content_block_stop", {"index": 0}),
        ev("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
        ev("message_stop", {})])
    with _client(rig).responses.stream(model="claude-x", input="Yes in French") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Oui" and final.status == "completed"
    assert final.usage.input_tokens == 4 and final.usage.output_tokens == 1


def test_openai_agents_sdk_runs_a_tool_loop_through_the_bridge(rig: Any) -> None:
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather of a city."""
        return f"4C in {city}"

    answers = iter([_call_answer(), completion("It is 4C in Oslo.")])
    rig.upstream.script = lambda body: Script(body=next(answers))
    model = agents.OpenAIResponsesModel(
        model="m1", openai_client=AsyncOpenAI(base_url=rig.url + "/v1", api_key="sk-proxy",
                                              max_retries=0))
    agent = agents.Agent(name="weather", instructions="Use tools.", tools=[get_weather],
                         model=model)
    result = agents.Runner.run_sync(agent, "Weather in Oslo?")
    assert result.final_output == "It is 4C in Oslo."
    tool_msg = rig.upstream.seen[-1].json["messages"][-1]
    assert tool_msg == {"role": "tool", "tool_call_id": "call_7", "content": "4C in Oslo"}


def test_passthrough_stream_is_relayed_and_recorded(rig_factory: Any, upstream: Any) -> None:
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])

    def ev(kind: str, **data: Any) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
    done = {"id": "resp_s", "object": "response", "status": "completed", "output": [],
            "usage": {"input_tokens": 11, "output_tokens": 2, "total_tokens": 13,
                      "input_tokens_details": {"cached_tokens": 8}}}
    pieces = [ev("response.created", response={**done, "status": "in_progress"}),
              ev("response.output_text.delta", delta="Hi"),
              ev("response.output_text.delta", delta="!"),
              ev("response.completed", response=done)]
    rig.upstream.script = Script(pieces=pieces)
    r = httpx.post(rig.url + "/v1/responses", timeout=10,
                   json={"model": "gpt-x", "input": "hi", "stream": True})
    assert r.content == b"".join(pieces)
    row = rig.ledger.rows()[-1]
    assert (row["status"], row["prompt_tokens"], row["cached_tokens"], row["output_tokens"]) == (
        "ok", 11, 8, 2)
    httpx.delete(rig.url + "/v1/responses/resp_s", timeout=10)
    assert (rig.upstream.seen[-1].path, rig.upstream.seen[-1].raw) == ("/v1/responses/resp_s", b"")


def test_passthrough_passes_canonicalise_tools_and_set_prompt_cache_key(
        rig_factory: Any, upstream: Any) -> None:
    # tool_order "name" (opt-in): the pass visibly reorders one request's tools (the default
    # first_seen sends a session's first tools as sent)
    rig = rig_factory(rewrite_fn="default",
                      rewrite={"openai_prompt_cache_key": True, "tenant": "acme", "tool_order": "name"},
                      backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    rig.upstream.script = Script(body={"id": "resp_1", "object": "response", "output": []})
    tools = [{"type": "function", "name": n, "description": f"{n} tool",
              "parameters": {"type": "object", "properties": {}}} for n in ("zeta", "alpha")]
    # the key is added only where OpenAI caches at all: a prompt of 1,024 tokens or more
    instructions = "You are an agent. Follow the airline policy exactly. " * 40
    body = {"model": "gpt-x", "instructions": instructions, "input": "go", "tools": tools}
    httpx.post(rig.url + "/v1/responses", json=body, timeout=10)
    sent = rig.upstream.seen[-1].json
    assert [t["name"] for t in sent["tools"]] == ["alpha", "zeta"]
    assert all(t["type"] == "function" for t in sent["tools"])
    assert sent["prompt_cache_key"].startswith("acme-")
    assert (sent["instructions"], sent["input"]) == (instructions, "go")


def test_backend_errors_keep_their_status_in_openai_shape(rig: Any) -> None:
    rig.upstream.script = Script(status=429, body={"type": "error", "error": {
        "type": "rate_limit_error", "message": "slow down"}})
    r = httpx.post(rig.url + "/v1/responses", json={"model": "claude-x", "input": "a"},
                   timeout=10)
    assert r.status_code == 429 and r.json()["error"]["message"] == "slow down"
    rig.upstream.script = Script(status=400, body={"error": {
        "message": "context too long", "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"}})
    r = httpx.post(rig.url + "/v1/responses", json={"model": "m1", "input": "a"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert [row["status"] for row in rig.ledger.rows()[-2:]] == ["upstream_error"] * 2


def test_backend_reasoning_becomes_a_reasoning_item(rig: Any) -> None:
    body = completion("42")
    body["choices"][0]["message"]["reasoning_content"] = "6 times 7"
    rig.upstream.script = Script(body=body)
    r = _client(rig).responses.create(model="m1", input="6*7?")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "6 times 7" and r.output_text == "42"
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [
        {"index": 0, "finish_reason": None, "delta": {"reasoning_content": "think"}}]}
    rig.upstream.script = Script(pieces=[b"data: " + json.dumps(obj).encode() + b"\n\n",
                                         chunk("ok"), chunk(finish="stop"), DONE])
    with _client(rig).responses.stream(model="m1", input="x") as stream:
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "think"


def test_response_objects_with_every_item_kind_pass_the_open_responses_schema() -> None:
    pytest.importorskip("llm_comply")
    from pathlib import Path

    import llm_comply
    from llm_comply.schema import SpecLoader

    from prefixgate.proxy.bridges.responses_chat_items import (
        output_from_chat,
        response_object,
        usage_object,
    )

    answer = _call_answer()
    msg = answer["choices"][0]["message"]
    msg.update(content="Checking.", reasoning_content="need weather")
    output, status = output_from_chat(answer)
    assert [o["type"] for o in output] == ["reasoning", "message", "function_call"]
    body = {"model": "m1", "input": "x", "tools": TOOLS, "tool_choice": "auto"}
    obj = response_object(body, "resp_1", 1, output, usage_object(answer["usage"]), status)
    spec = SpecLoader(str(Path(llm_comply.__file__).parent / "specs" / "openresponses.json"))
    assert spec.validate(obj, "ResponseResource") == []


def test_stream_events_with_reasoning_text_and_calls_pass_the_open_responses_schema() -> None:
    pytest.importorskip("llm_comply")
    from pathlib import Path

    import llm_comply
    from llm_comply.schema import SpecLoader

    from prefixgate.proxy.bridges.responses_chat_stream import ResponsesStream
    from prefixgate.proxy.core.sse import parse_event

    def raw(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1,
                                       "model": "m", "choices": [{"index": 0, "delta": delta,
                                                                  "finish_reason": finish}]}
                                      ).encode() + b"\n\n"
    pieces = [raw({"reasoning_content": "hm"}), raw({"content": "Let me check."}),
              raw({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{}"}}]}),
              raw({}, "tool_calls"), DONE]
    stream = ResponsesStream({"model": "m1", "input": "x", "tools": TOOLS}, "resp_1")
    events = [json.loads(parse_event(out).data or "{}")
              for p in pieces for out in stream.map(p, parse_event(p))]
    spec = SpecLoader(str(Path(llm_comply.__file__).parent / "specs" / "openresponses.json"))
    errors = [(e["type"], spec.validate_sse_event(e["type"], e)) for e in events]
    assert [x for x in errors if x[1]] == []
    assert events[-1]["type"] == "response.completed"
    assert [o["type"] for o in events[-1]["response"]["output"]] == [
        "reasoning", "message", "function_call"]


def test_bridged_request_runs_the_passes_and_says_so(rig_factory: Any) -> None:
    # tool_order "name" (opt-in): the pass visibly reorders one request's tools
    rig = rig_factory(rewrite_fn="default", rewrite={"tool_order": "name"})
    rig.upstream.script = Script(body=completion("ok"))
    tools = [{"type": "function", "name": n, "parameters": {"type": "object", "properties": {}}}
             for n in ("zeta", "alpha")]
    r = httpx.post(rig.url + "/v1/responses", timeout=10, json={
        "model": "m1", "input": "go", "tools": tools,
        "instructions": "Agent. Today is 2026-12-01 10:42:17 UTC."})
    assert r.status_code == 200
    sent = rig.upstream.seen[-1].json
    assert [t["function"]["name"] for t in sent["tools"]] == ["alpha", "zeta"]
    assert "canonicalize_tools" in r.headers["x-prefixgate-edits"]
    assert rig.ledger.rows()[-1]["edits"] == r.headers["x-prefixgate-edits"]
