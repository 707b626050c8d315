"""Issue 8, class 5 and invariant *Translation is lossless or refuses*: regression tests, one per
behaviour. A->O = Anthropic client -> OpenAI-compatible backend; O->A = the other way."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.core.errors import InvalidRequest
from prefixgate.proxy.core.usage import AnthropicStreamWatcher
from tests.proxy import bridging

USER = [{"role": "user", "content": "hi"}]


def a2o(**extra: Any) -> dict[str, Any]:
    return bridging.request("anthropic", {"model": "m", "max_tokens": 8, "messages": USER,
                                           **extra})


def o2a(**extra: Any) -> dict[str, Any]:
    return bridging.request("openai", {"model": "claude-x", "messages": USER, **extra})


def refused(fn: Any, **extra: Any) -> str:
    with pytest.raises(InvalidRequest) as e:
        fn(**extra)
    assert e.value.status == 400 and e.value.param
    return e.value.param  # type: ignore[no-any-return]


def user_blocks(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


# --- A->O -----------------------------------------------------------------------------------

def test_a2o_document_with_text_source_is_carried_between_document_delimiters() -> None:
    doc = {"type": "document", "title": "Contract v2", "context": "signed",
           "source": {"type": "text", "media_type": "text/plain", "data": "Clause 1. Pay."}}
    out = a2o(messages=user_blocks(doc, {"type": "text", "text": "Summarise."}))
    assert out["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": '<document title="Contract v2" context="signed" '
                                 'media_type="text/plain">'},
        {"type": "text", "text": "Clause 1. Pay."},
        {"type": "text", "text": "</document>"},
        {"type": "text", "text": "Summarise."}]}]


def test_a2o_pdf_document_becomes_a_file_part() -> None:
    doc = {"type": "document", "title": "a.pdf",
           "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    out = a2o(messages=user_blocks(doc))
    assert out["messages"][0]["content"] == [{"type": "file", "file": {
        "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}}]


def test_a2o_document_with_url_source_is_400_naming_the_source() -> None:
    doc = {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}
    assert refused(a2o, messages=user_blocks(doc)) == "messages[0].content[0].source.type"


def test_a2o_search_result_is_carried_with_its_source_and_title() -> None:
    sr = {"type": "search_result", "source": "https://kb/1", "title": "KB 1",
          "content": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}]}
    out = a2o(messages=user_blocks(sr))
    assert [p["text"] for p in out["messages"][0]["content"]] == [
        '<search_result source="https://kb/1" title="KB 1">', "A.", "B.", "</search_result>"]


def test_a2o_adjacent_text_blocks_stay_separate_parts_never_glued() -> None:
    out = a2o(messages=user_blocks({"type": "text", "text": "item 1"},
                                   {"type": "text", "text": "item 2"}))
    assert out["messages"][0]["content"] == [{"type": "text", "text": "item 1"},
                                             {"type": "text", "text": "item 2"}]


def test_a2o_tool_result_error_is_carried_between_tool_error_delimiters() -> None:
    tr = {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}
    out = a2o(messages=[*USER, call, *user_blocks(tr)])
    assert out["messages"][2]["content"] == [{"type": "text", "text": "<tool_error>"},
                                             {"type": "text", "text": "boom"},
                                             {"type": "text", "text": "</tool_error>"}]


def test_a2o_image_inside_a_tool_result_is_400_not_dropped() -> None:
    img = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    tr = {"type": "tool_result", "tool_use_id": "t1", "content": [img]}
    assert refused(a2o, messages=user_blocks(tr)) == "messages[0].content[0].content[0].type"


def test_a2o_thinking_enabled_and_thinking_blocks_are_400() -> None:
    assert refused(a2o, thinking={"type": "enabled", "budget_tokens": 1024}) == "thinking"
    assert a2o(thinking={"type": "disabled"})["messages"] == USER
    turn = [*USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s"}]}]
    assert refused(a2o, messages=turn) == "messages[1].content[0].type"


def test_a2o_server_tool_is_400_naming_its_type() -> None:
    tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
    assert refused(a2o, tools=tools) in ("tools[0].max_uses", "tools[0].type")


def test_a2o_text_after_tool_use_is_400_because_order_would_be_lost() -> None:
    turn = [*USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        {"type": "text", "text": "after"}]}]
    assert refused(a2o, messages=turn) == "messages[1].content[1]"


def test_a2o_disable_parallel_tool_use_maps_to_parallel_tool_calls_false() -> None:
    out = a2o(tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert out["tool_choice"] == "auto" and out["parallel_tool_calls"] is False


@pytest.mark.parametrize("field", ["container", "mcp_servers", "context_management",
                                   "output_config", "not_a_field"])
def test_a2o_field_without_counterpart_is_400_naming_it(field: str) -> None:
    assert refused(a2o, **{field: {"x": 1}}) == field


def test_a2o_citations_requested_on_a_document_are_400() -> None:
    doc = {"type": "document", "citations": {"enabled": True},
           "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    assert refused(a2o, messages=user_blocks(doc)) == "messages[0].content[0].citations"


def test_a2o_unknown_key_inside_a_block_is_400_naming_its_path() -> None:
    assert refused(a2o, messages=user_blocks({"type": "text", "text": "x", "weight": 2})) == (
        "messages[0].content[0].weight")


def test_a2o_refusal_answer_becomes_text_with_stop_reason_refusal() -> None:
    from prefixgate.proxy.bridges.anthropic_openai import response_to_anthropic
    msg = response_to_anthropic({"id": "c", "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": None,
                                             "refusal": "I can't help with that."}}]}, "m")
    assert msg["content"] == [{"type": "text", "text": "I can't help with that.", "citations": None}]
    assert msg["stop_reason"] == "refusal"


# --- O->A -----------------------------------------------------------------------------------

def test_o2a_mid_conversation_system_message_stays_in_place_between_delimiters() -> None:
    out = o2a(messages=[{"role": "system", "content": "S0"}, *USER,
                        {"role": "assistant", "content": "A"},
                        {"role": "system", "content": "Now be terse."},
                        {"role": "user", "content": "next"}])
    assert out["system"] == "S0"
    assert out["messages"][2] == {"role": "user", "content": [
        {"type": "text", "text": "<system>"}, {"type": "text", "text": "Now be terse."},
        {"type": "text", "text": "</system>"}, {"type": "text", "text": "next"}]}


def test_o2a_several_leading_system_messages_stay_separate_blocks() -> None:
    out = o2a(messages=[{"role": "system", "content": "S1"},
                        {"role": "developer", "content": "S2"}, *USER])
    assert out["system"] == [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]


def test_o2a_function_role_message_becomes_the_tool_result_of_its_function_call() -> None:
    out = o2a(messages=[*USER, {"role": "assistant", "content": None,
                                "function_call": {"name": "f", "arguments": '{"a":1}'}},
                        {"role": "function", "name": "f", "content": "42"}])
    assert out["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "f",
                                           "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": "42"}]}]


def test_o2a_audio_input_part_is_400() -> None:
    msgs = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": "UklGRg==", "format": "wav"}}]}]
    assert refused(o2a, messages=msgs) == "messages[0].content[0].type"


@pytest.mark.parametrize("field,value", [
    ("response_format", {"type": "json_object"}), ("n", 2), ("seed", 7), ("logprobs", True),
    ("frequency_penalty", 0.5), ("logit_bias", {"50256": -100}), ("audio", {"voice": "x"}),
    ("modalities", ["text", "audio"]), ("reasoning_effort", "high"), ("store", True),
    ("metadata", {"k": "v"}), ("web_search_options", {}), ("not_a_field", 1)])
def test_o2a_field_without_counterpart_is_400_naming_it(field: str, value: Any) -> None:
    assert refused(o2a, **{field: value}) == field


@pytest.mark.parametrize("field,value", [
    ("response_format", {"type": "text"}), ("n", 1), ("seed", None), ("logprobs", False),
    ("frequency_penalty", 0), ("store", False), ("prompt_cache_key", "k")])
def test_o2a_default_valued_fields_are_mapped_by_leaving_them_out(field: str, value: Any) -> None:
    assert field not in o2a(**{field: value})


def test_o2a_max_tokens_zero_stays_zero() -> None:
    assert o2a(max_tokens=0)["max_tokens"] == 0
    assert o2a(max_completion_tokens=0)["max_tokens"] == 0
    assert refused(o2a, max_tokens=5, max_completion_tokens=6) == "max_tokens"


def test_o2a_parallel_tool_calls_false_maps_to_disable_parallel_tool_use() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    out = o2a(tools=tools, parallel_tool_calls=False)
    assert out["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_o2a_tool_cache_control_is_kept_on_the_anthropic_tool() -> None:
    tools = [{"type": "function", "function": {"name": "f"}, "cache_control": {"type": "ephemeral"}}]
    assert o2a(tools=tools)["tools"][0]["cache_control"] == {"type": "ephemeral"}


def test_o2a_participant_name_is_400() -> None:
    assert refused(o2a, messages=[{"role": "user", "content": "hi", "name": "bob"}]) == (
        "messages[0].name")


def test_o2a_assistant_refusal_in_history_is_carried_between_refusal_delimiters() -> None:
    out = o2a(messages=[*USER, {"role": "assistant", "content": None, "refusal": "No."},
                        {"role": "user", "content": "ok"}])
    assert out["messages"][1]["content"] == [{"type": "text", "text": "<refusal>No.</refusal>"}]


def test_o2a_safety_identifier_maps_to_metadata_user_id() -> None:
    assert o2a(safety_identifier="u-1")["metadata"] == {"user_id": "u-1"}
    assert refused(o2a, user="a", safety_identifier="b") == "safety_identifier"


def test_o2a_deprecated_functions_map_to_tools() -> None:
    out = o2a(functions=[{"name": "f", "parameters": {"type": "object"}}],
              function_call={"name": "f"})
    assert out["tools"] == [{"name": "f", "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == {"type": "tool", "name": "f"}


@pytest.mark.parametrize("value", [5, "yes", [True], {"include_usage": "yes"},
                                   {"include_usage": True, "extra": 1}])
def test_o2a_bad_stream_options_is_400_from_translate_request_not_the_stream(value: Any) -> None:
    param = refused(o2a, stream=True, stream_options=value)
    assert param.startswith("stream_options")


def test_o2a_every_checked_body_builds_its_stream_mapper() -> None:
    body = {"model": "claude-x", "messages": USER, "stream": True,
            "stream_options": {"include_usage": True}}
    bridging.request("openai", body)
    assert bridging.mapper("openai", "claude-x", AnthropicStreamWatcher(), body)


def test_o2a_refused_field_reaches_no_upstream_and_names_the_param(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "claude-x", "messages": USER, "seed": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    assert rig.upstream.seen == []


def test_a2o_refused_field_is_an_anthropic_400_naming_the_field(rig: Any) -> None:
    doc = {"type": "document", "source": {"type": "file", "file_id": "f_1"}}
    r = httpx.post(rig.url + "/v1/messages", timeout=30,
                   json={"model": "m1", "max_tokens": 8, "messages": user_blocks(doc)})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "messages[0].content[0].source.type" in r.json()["error"]["message"]
    assert rig.upstream.seen == []


def test_a2o_streamed_refusal_becomes_text_and_stop_reason_refusal() -> None:
    import json

    from prefixgate.proxy.bridges.anthropic_openai import StreamMapper
    from prefixgate.proxy.core.sse import SSEEvent

    m = StreamMapper("m")
    chunks = ({"id": "c", "choices": [{"index": 0, "delta": {"refusal": "No."}}]},
              {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    out = b"".join(e for c in chunks for e in m.map(b"", SSEEvent("message", json.dumps(c))))
    out += b"".join(m.map(b"", SSEEvent("message", "[DONE]")))
    assert b'"text_delta","text":"No."' in out and b'"stop_reason":"refusal"' in out


def test_o2a_stream_with_non_object_stream_options_is_400_before_any_send(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30, json={
        "model": "claude-x", "messages": USER, "stream": True, "stream_options": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    assert rig.upstream.seen == []
    row = rig.ledger.rows()[-1]
    assert (row["status"], row["http_status"]) == ("InvalidRequest", 400)


@pytest.mark.parametrize("tier, sent", [("auto", "auto"), ("standard_only", "default")])
def test_a2o_service_tier_arrives_as_its_chat_completions_value(tier: str, sent: str) -> None:
    # auto is the default on both APIs, but an explicit field is sent, never dropped (fuzzer)
    assert a2o(service_tier=tier)["service_tier"] == sent


def test_o2a_parallel_tool_calls_true_is_sent_as_disable_parallel_tool_use_false() -> None:
    # true is the default on both APIs, but a field the client gave is sent, never dropped
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert o2a(tools=tools, parallel_tool_calls=True)["tool_choice"] == {
        "type": "auto", "disable_parallel_tool_use": False}
    assert refused(o2a, parallel_tool_calls=True) == "parallel_tool_calls"  # no tools: nowhere
    assert o2a(tools=tools, tool_choice="none", parallel_tool_calls=True)["tool_choice"] == {"type": "none"}


def test_a2o_disable_parallel_tool_use_false_is_sent_as_parallel_tool_calls_true() -> None:
    assert a2o(tool_choice={"type": "auto", "disable_parallel_tool_use": False})["parallel_tool_calls"] is True


def test_a2o_pdf_document_with_context_carries_title_then_context_in_its_tag() -> None:
    # fuzzer: the title (file name) arrived after the context tag, out of the block's order
    doc = {"type": "document", "title": "Q3 audit", "context": "from finance",
           "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    out = a2o(messages=user_blocks(doc))
    assert out["messages"][0]["content"][0] == {
        "type": "text", "text": '<document title="Q3 audit" context="from finance">'}
    assert out["messages"][0]["content"][1]["file"]["filename"] == "Q3 audit"
