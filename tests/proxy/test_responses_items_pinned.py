"""Responses request items -> Chat messages and Chat answers -> ``response`` objects, point by
point (issue 21): each field a Responses client sends reaches the Chat body as the OpenAI
references map it (a client's ``prompt_cache_key`` included, unchanged), each thing the bridge
cannot carry is a 400 naming it, and each field of the response object echoes the request.

Pure functions of :mod:`prefixgate.proxy.bridges.responses_chat_items` (its docstring is the
field table).
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.proxy.bridges.responses_chat_items import (
    call_item,
    input_items,
    items_to_messages,
    new_id,
    output_from_chat,
    reasoning_item,
    response_object,
    text_item,
    to_chat,
    usage_object,
)
from prefixgate.proxy.core.errors import InvalidRequest

BASE: dict[str, Any] = {"model": "m", "input": "hi"}


def refused(fn: Any, *args: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        fn(*args)
    assert err.value.status == 400
    return err.value


def msgs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return items_to_messages(items)


# ---- ids --------------------------------------------------------------------------------------

def test_new_ids_are_prefixed_and_unique() -> None:
    a, b = new_id("resp"), new_id("resp")
    assert a != b and a.startswith("resp_") and len(a) == 5 + 32
    int(a[5:], 16)


# ---- input items -> messages ------------------------------------------------------------------

def test_a_string_input_is_one_user_message() -> None:
    assert input_items(BASE) == [{"type": "message", "role": "user", "content": "hi"}]
    assert to_chat(BASE, []) == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("bad", [None, 3, {"type": "message"}, ["hi"], [{"type": "message"}, "x"]])
def test_input_that_is_not_a_string_or_item_list_is_a_400(bad: Any) -> None:
    e = refused(input_items, {"model": "m", "input": bad})
    assert e.param == "input" and e.code == "invalid_type"
    assert e.message.startswith("'input' must be a string or an array of input items")


def test_input_items_are_a_copy_of_the_list() -> None:
    items = [{"type": "message", "role": "user", "content": "a"}]
    got = input_items({"input": items})
    assert got == items and got is not items


def test_messages_by_role_developer_becomes_system() -> None:
    items = [{"type": "message", "role": "developer", "content": "rules"},
             {"role": "system", "content": "sys"},  # type defaults to message
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "b"},
                          {"type": "text", "text": "c"}]}]
    assert msgs(items) == [
        {"role": "system", "content": "rules"}, {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "q"}]},  # a user's parts stay parts
        {"role": "assistant", "content": "abc"}]  # others' text parts are joined


def test_an_image_part_is_an_image_url_part() -> None:
    items = [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"},
        {"type": "input_image", "image_url": "https://x/y.png"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "low"}]}]
    assert msgs(items)[0]["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "auto"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": "low"}}]
    # an assistant message with an image keeps its parts too
    assert isinstance(msgs([{"role": "assistant", "content": [
        {"type": "input_image", "image_url": "https://x"}]}])[0]["content"], list)


def test_an_image_by_file_id_is_a_400() -> None:
    e = refused(msgs, [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}])
    assert e.param == "input[0].content[0]" and e.code == "unsupported_parameter"
    assert e.message.startswith("'input[0].content[0]': only images given by URL or data URL")


def test_an_unknown_part_type_is_a_400() -> None:
    e = refused(msgs, [{"role": "user", "content": "a"},
                       {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])
    assert e.param == "input[1].content[0]"
    assert e.message.startswith("'input[1].content[0]': content part type 'input_file' cannot be bridged")
    e = refused(msgs, [{"role": "user", "content": ["text"]}])
    assert e.param == "input[0].content[0]" and e.code == "invalid_type"
    assert e.message.startswith("'input[0].content[0]' must be an object")


@pytest.mark.parametrize("role", [None, "tool", "critic"])
def test_a_message_role_outside_the_four_is_a_400(role: Any) -> None:
    e = refused(msgs, [{"type": "message", "role": role, "content": "x"}])
    assert e.param == "input[0].role" and e.code == "invalid_value"
    assert e.message.startswith("'input[0].role' must be user, assistant, system or developer")


@pytest.mark.parametrize("content", [None, 3, {"text": "x"}])
def test_message_content_must_be_a_string_or_parts(content: Any) -> None:
    e = refused(msgs, [{"role": "user", "content": content}])
    assert e.param == "input[0].content" and e.code == "invalid_type"
    assert e.message.startswith("'input[0].content' must be a string or a list of parts")


def test_a_text_that_is_not_a_string_is_a_400_naming_it() -> None:
    e = refused(msgs, [{"role": "user", "content": [{"type": "input_text", "text": 5}]}])
    assert e.param == "input[0].content[0].text" and e.code == "invalid_type"
    assert e.message.startswith("Invalid type for 'input[0].content[0].text': expected a string")
    # a missing text is an empty string, not a 400
    assert msgs([{"role": "assistant", "content": [{"type": "output_text"}]}])[0]["content"] == ""


def test_function_calls_and_outputs_pair_as_chat_tool_calls() -> None:
    items = [{"role": "user", "content": "weather?"},
             {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"a": 1}'},
             {"type": "function_call", "id": "fc_2", "name": "put"},  # no call_id: the item id
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"type": "function_call_output", "call_id": "fc_2",
              "output": [{"type": "input_text", "text": "o"}, {"type": "input_image"},
                         {"type": "output_text", "text": "k"}, "junk"]},
             {"type": "reasoning", "summary": []}]
    assert msgs(items) == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}},
            {"id": "fc_2", "type": "function", "function": {"name": "put", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "fc_2", "content": "ok"}]


def test_a_call_without_any_id_gets_one() -> None:
    out = msgs([{"type": "function_call", "name": "get"}])
    assert out[0]["tool_calls"][0]["id"].startswith("call_")


def test_a_call_after_assistant_text_joins_that_message_but_not_a_users() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"}
    out = msgs([{"role": "assistant", "content": ""}, call])
    assert out == [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]}]
    out = msgs([{"role": "assistant", "content": "Let me look."}, call])
    assert len(out) == 2 and out[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]}
    out = msgs([{"role": "user", "content": ""}, call])
    assert len(out) == 2 and out[1]["role"] == "assistant"


def test_a_function_call_output_that_is_not_text_is_a_400() -> None:
    e = refused(msgs, [{"type": "function_call_output", "call_id": "c", "output": {"a": 1}}])
    assert e.param == "input[0].output" and e.code == "invalid_type"
    assert e.message.startswith("'input[0].output' must be a string or a list of text parts")
    out = msgs([{"type": "function_call_output", "call_id": "c"}])
    assert out == [{"role": "tool", "tool_call_id": "c", "content": ""}]
    e = refused(msgs, [{"type": "function_call_output", "call_id": "c",
                        "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": 5}]}])
    assert e.param == "input[0].output[1].text" and e.code == "invalid_type"


@pytest.mark.parametrize("kind", ["item_reference", "computer_call", "web_search_call"])
def test_an_item_type_chat_cannot_take_is_a_400(kind: str) -> None:
    e = refused(msgs, [{"role": "user", "content": "x"}, {"type": kind, "id": "x"}])
    assert e.param == "input[1].type" and e.code == "unsupported_parameter"
    assert e.message.startswith(f"'input[1].type': item type {kind!r} cannot be bridged to Chat Completions")


# ---- the other request fields -----------------------------------------------------------------

def test_function_tools_and_tool_choice_map_to_chat() -> None:
    body = {**BASE, "tools": [{"type": "function", "name": "get", "description": "d",
                               "parameters": {"type": "object"}, "strict": True, "extra": 1}],
            "tool_choice": {"type": "function", "name": "get"}}
    chat = to_chat(body, [])
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get", "description": "d", "parameters": {"type": "object"}, "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    for choice in ("auto", "none", "required"):
        assert to_chat({**body, "tool_choice": choice}, [])["tool_choice"] == choice
    assert "tool_choice" not in to_chat({**body, "tool_choice": None}, [])
    assert "tools" not in to_chat({**BASE, "tools": [], "tool_choice": "auto"}, [])
    assert to_chat({**body, "tool_choice": {"type": "function"}}, [])["tool_choice"] == \
        {"type": "function", "function": {"name": ""}}


@pytest.mark.parametrize("tool", [{"type": "web_search"}, "get", {"name": "get"}])
def test_a_built_in_tool_is_a_400(tool: Any) -> None:
    e = refused(to_chat, {**BASE, "tools": [{"type": "function", "name": "a"}, tool]}, [])
    kind = tool.get("type") if isinstance(tool, dict) else None
    assert e.param == "tools[1].type" and e.code == "unsupported_parameter"
    assert e.message.startswith(f"'tools[1].type': {kind!r}: built-in tools run on OpenAI's servers")


def test_tools_not_a_list_is_a_400() -> None:
    e = refused(to_chat, {**BASE, "tools": {"type": "function"}}, [])
    assert e.param == "tools" and e.code == "invalid_type"
    assert e.message.startswith("'tools' must be an array")


@pytest.mark.parametrize("choice", [{"type": "allowed_tools"}, {"type": "web_search"}, "sometimes"])
def test_a_tool_choice_that_cannot_be_bridged_is_a_400(choice: Any) -> None:
    e = refused(to_chat, {**BASE, "tools": [{"type": "function", "name": "a"}], "tool_choice": choice}, [])
    assert e.param == "tool_choice" and e.code == "unsupported_parameter"
    assert e.message.startswith(f"'tool_choice': {choice!r} cannot be bridged (function tools only)")


def test_text_format_maps_to_response_format() -> None:
    schema_fmt = {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True,
                  "description": "d"}
    assert to_chat({**BASE, "text": {"format": schema_fmt}}, [])["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": True, "description": "d"}}
    assert to_chat({**BASE, "text": {"format": {"type": "json_object"}}}, [])["response_format"] == \
        {"type": "json_object"}
    for text in ({"format": {"type": "text"}}, {"format": {}}, {"verbosity": None}, {"format": None}):
        assert "response_format" not in to_chat({**BASE, "text": text}, [])
    e = refused(to_chat, {**BASE, "text": {"format": {"type": "grammar"}}}, [])
    assert e.param == "text.format.type"
    assert e.message.startswith("'text.format.type': 'grammar' is not a Chat Completions format")


def test_a_clients_prompt_cache_key_and_sampling_fields_pass_unchanged() -> None:
    body = {**BASE, "prompt_cache_key": "tenant-7/session-3", "max_output_tokens": 64,
            "temperature": 0.0, "top_p": 0.9, "parallel_tool_calls": False, "user": "u1",
            "prompt_cache_retention": "24h", "safety_identifier": "sid"}
    chat = to_chat(body, [])
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "prompt_cache_key": "tenant-7/session-3", "max_tokens": 64, "temperature": 0.0,
                    "top_p": 0.9, "parallel_tool_calls": False, "user": "u1",
                    "prompt_cache_retention": "24h", "safety_identifier": "sid"}


@pytest.mark.parametrize("tier, sent", [("auto", None), ("default", None), (None, None),
                                        ("flex", "flex"), ("priority", "priority")])
def test_service_tier_default_is_left_out(tier: Any, sent: Any) -> None:
    assert to_chat({**BASE, "service_tier": tier}, []).get("service_tier") == sent


def test_reasoning_effort_and_verbosity_map_and_absent_ones_do_not() -> None:
    chat = to_chat({**BASE, "reasoning": {"effort": "low"}, "text": {"verbosity": "high"}}, [])
    assert chat["reasoning_effort"] == "low" and chat["verbosity"] == "high"
    chat = to_chat({**BASE, "reasoning": {}, "text": {}}, [])
    assert "reasoning_effort" not in chat and "verbosity" not in chat
    chat = to_chat({**BASE, "reasoning": None, "text": None}, [])
    assert "reasoning_effort" not in chat and "verbosity" not in chat


def test_stream_asks_for_usage_and_false_does_not_stream() -> None:
    chat = to_chat({**BASE, "stream": True}, [])
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert "stream" not in to_chat({**BASE, "stream": False}, [])


def test_instructions_come_first_history_then_input() -> None:
    history = [{"type": "message", "role": "user", "content": "one"},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "1"}]}]
    chat = to_chat({**BASE, "instructions": "be brief", "input": "two"}, history)
    assert chat["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "one"}, {"role": "assistant", "content": "1"},
                                {"role": "user", "content": "two"}]
    assert to_chat({**BASE, "instructions": ""}, [])["messages"] == [{"role": "user", "content": "hi"}]


def test_a_default_field_holding_its_default_passes_and_another_value_is_refused() -> None:
    assert to_chat({**BASE, "truncation": "disabled", "include": [], "top_logprobs": 0,
                    "background": False, "conversation": None}, []) == to_chat(BASE, [])
    e = refused(to_chat, {**BASE, "top_logprobs": False}, [])  # False == 0, but not the default
    assert e.param == "top_logprobs" and e.code == "unsupported_parameter"
    assert e.message.startswith("'top_logprobs': the bridged response carries no logprobs")
    e = refused(to_chat, {**BASE, "conversation": "conv_1"}, [])
    assert e.message.startswith("'conversation': conversation objects live at OpenAI")
    e = refused(to_chat, {**BASE, "frobnicate": 1}, [])
    assert e.message == ("'frobnicate': this field has no Chat Completions counterpart and dropping it "
                         "would change the request.")


@pytest.mark.parametrize("key, value", [("text", "low"), ("reasoning", ["x"]), ("stream_options", 1)])
def test_sub_field_objects_must_be_objects(key: str, value: Any) -> None:
    e = refused(to_chat, {**BASE, key: value}, [])
    assert e.param == key and e.code == "invalid_type"
    assert e.message.startswith(f"Invalid type for '{key}': expected an object")


def test_unknown_sub_fields_and_reasoning_summaries_are_refused() -> None:
    e = refused(to_chat, {**BASE, "reasoning": {"effort": "low", "budget": 3}}, [])
    assert e.param == "reasoning.budget"
    assert e.message.startswith("'reasoning.budget': this field has no Chat Completions counterpart")
    e = refused(to_chat, {**BASE, "reasoning": {"generate_summary": "auto"}}, [])
    assert e.param == "reasoning.generate_summary"
    assert e.message == "'reasoning.generate_summary': a Chat Completions backend returns no reasoning summaries."
    assert to_chat({**BASE, "reasoning": {"summary": None, "generate_summary": None}}, []) == to_chat(BASE, [])


def test_an_unpaired_tool_output_is_a_400_on_input() -> None:
    e = refused(to_chat, {**BASE, "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, [])
    assert e.param == "input" and e.code == "unsupported_parameter"
    assert e.message.startswith("'input' cannot be bridged to Chat Completions: this tool message answers")


# ---- answer -> response -----------------------------------------------------------------------

def test_usage_maps_every_count() -> None:
    u = {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 6},
         "completion_tokens_details": {"reasoning_tokens": 2}}
    assert usage_object(u) == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6},
                               "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 2},
                               "total_tokens": 14}
    zero = {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}
    assert usage_object(None) == zero and usage_object([1]) == zero
    assert usage_object({"prompt_tokens": None, "prompt_tokens_details": None,
                         "completion_tokens_details": None}) == zero


def test_output_items_shapes() -> None:
    assert text_item("msg_1", "hi") == {"type": "message", "id": "msg_1", "status": "completed",
                                        "role": "assistant", "content": [
                                            {"type": "output_text", "text": "hi", "annotations": [],
                                             "logprobs": []}]}
    assert reasoning_item("rs_1", "t") == {"type": "reasoning", "id": "rs_1", "summary": [],
                                           "content": [{"type": "reasoning_text", "text": "t"}],
                                           "status": "completed"}
    assert call_item("fc_1", "c1", "get", "{}") == {"type": "function_call", "id": "fc_1", "call_id": "c1",
                                                    "name": "get", "arguments": "{}", "status": "completed"}


def test_output_from_chat_keeps_reasoning_text_calls_in_that_order() -> None:
    answer = {"choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "reasoning_content": "hmm", "content": "Checking.",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}},
                       {"type": "function", "function": {}}]}}]}
    out, status = output_from_chat(answer)
    assert status == "completed"
    assert [o["type"] for o in out] == ["reasoning", "message", "function_call", "function_call"]
    assert out[0]["content"][0]["text"] == "hmm" and out[0]["id"].startswith("rs_")
    assert out[1]["content"][0]["text"] == "Checking." and out[1]["id"].startswith("msg_")
    assert (out[2]["call_id"], out[2]["name"], out[2]["arguments"]) == ("c1", "get", '{"a":1}')
    assert out[2]["id"].startswith("fc_")
    assert out[3]["call_id"].startswith("call_") and out[3]["name"] == "" and out[3]["arguments"] == "{}"


def test_output_from_chat_refusal_reasoning_key_length_and_empty() -> None:
    out, status = output_from_chat({"choices": [{"finish_reason": "length", "message": {
        "reasoning": "r", "refusal": "no"}}]})
    assert status == "incomplete" and [o["type"] for o in out] == ["reasoning", "message"]
    assert out[1]["content"][0]["text"] == "no"
    assert output_from_chat({}) == ([], "completed")
    # empty or structured reasoning (not text) makes no reasoning item
    out, _ = output_from_chat({"choices": [{"message": {"reasoning_content": "", "reasoning": "", "content": "a"}}]})
    assert [o["type"] for o in out] == ["message"]
    out, _ = output_from_chat({"choices": [{"message": {"reasoning": {"text": "r"}, "content": "a"}}]})
    assert [o["type"] for o in out] == ["message"]
    assert output_from_chat({"choices": [{"message": {"content": "", "reasoning_content": ""}}]}) == \
        ([], "completed")


def test_response_object_echoes_the_request() -> None:
    body = {"model": "m1", "instructions": "be brief", "previous_response_id": "resp_0",
            "tools": [{"type": "function", "name": "get"}, "junk"], "tool_choice": "required",
            "truncation": "disabled", "parallel_tool_calls": False,
            "text": {"format": {"type": "json_object"}}, "top_p": 0.5, "temperature": 0.2,
            "top_logprobs": 0, "reasoning": {"effort": "low"}, "max_output_tokens": 9,
            "max_tool_calls": None, "store": False, "service_tier": "flex", "metadata": {"k": "v"},
            "user": "u", "safety_identifier": "s", "prompt_cache_key": "pck-1"}
    usage = usage_object({})
    r = response_object(body, "resp_1", 1700, [], usage, "completed")
    completed_at = r.pop("completed_at")
    assert isinstance(completed_at, int) and completed_at >= 1700
    assert r == {
        "id": "resp_1", "object": "response", "created_at": 1700, "status": "completed",
        "incomplete_details": None, "model": "m1", "previous_response_id": "resp_0",
        "instructions": "be brief", "output": [], "error": None,
        "tools": [{"description": None, "parameters": None, "strict": None, "type": "function",
                   "name": "get"}],
        "tool_choice": "required", "truncation": "disabled", "parallel_tool_calls": False,
        "text": {"format": {"type": "json_object"}}, "top_p": 0.5, "temperature": 0.2,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": 0,
        "reasoning": {"effort": "low"}, "usage": usage, "max_output_tokens": 9, "max_tool_calls": None,
        "store": False, "background": False, "service_tier": "flex", "metadata": {"k": "v"},
        "user": "u", "safety_identifier": "s", "prompt_cache_key": "pck-1"}


def test_response_object_defaults_for_a_bare_request() -> None:
    r = response_object({"input": "x"}, "resp_1", 5, [], None, "in_progress")
    assert r["completed_at"] is None and r["incomplete_details"] is None
    assert (r["model"], r["previous_response_id"], r["instructions"], r["tools"]) == ("", None, None, [])
    assert (r["tool_choice"], r["truncation"], r["parallel_tool_calls"]) == ("auto", "disabled", True)
    assert r["text"] == {"format": {"type": "text"}} and (r["top_p"], r["temperature"]) == (1.0, 1.0)
    assert r["reasoning"] == {"effort": None, "summary": None} and r["top_logprobs"] == 0
    assert (r["store"], r["service_tier"], r["metadata"], r["user"]) == (True, "default", {}, None)
    assert (r["usage"], r["max_output_tokens"], r["prompt_cache_key"]) == (None, None, None)
    inc = response_object({}, "resp_1", 5, [], None, "incomplete")
    assert inc["incomplete_details"] == {"reason": "max_output_tokens"} and isinstance(inc["completed_at"], int)
    assert response_object({}, "resp_1", 5, [], None, "failed")["completed_at"] is None


@pytest.mark.parametrize("item, param", [
    ({"type": "function_call", "call_id": 1, "name": "f"}, "input[0].call_id"),
    ({"type": "function_call", "id": ["x"], "name": "f"}, "input[0].id"),
    ({"type": "function_call", "call_id": "c", "name": 2}, "input[0].name"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}, "input[0].arguments"),
    ({"type": "function_call_output", "call_id": 3, "output": "x"}, "input[0].call_id"),
    ({"role": "assistant", "content": [{"type": "refusal", "refusal": 4}]}, "input[0].content[0].refusal"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "https://x", "detail": 5}]},
     "input[0].content[0].detail"),
])
def test_a_field_of_the_wrong_type_is_a_400_naming_its_path(item: dict[str, Any], param: str) -> None:
    e = refused(msgs, [item])
    assert e.param == param and e.code == "invalid_type"
    assert e.message == f"Invalid type for '{param}': expected a string."


def test_the_file_id_refusal_says_why() -> None:
    e = refused(msgs, [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}])
    assert e.message == ("'input[0].content[0]': only images given by URL or data URL can be bridged "
                         "(file_id names a file stored at OpenAI).")


def test_a_reasoning_item_in_the_middle_drops_only_itself() -> None:
    items = [{"role": "user", "content": "q"}, {"type": "reasoning", "summary": []},
             {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]
    assert msgs(items) == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                           {"role": "user", "content": "q2"}]
