"""Tool-schema drafting text logic: frame, names, keys, enum values, earlier calls' values."""

from __future__ import annotations

import json

from prefixgate.local_engine.sched.tool_call_state import ToolContext, next_literal, tool_context_or_none

TOOLS = [
    {"type": "function", "function": {"name": "get_user_details", "parameters": {
        "type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}}},
    {"type": "function", "function": {"name": "get_reservation_details", "parameters": {
        "type": "object", "properties": {"reservation_id": {"type": "string"}},
        "required": ["reservation_id"]}}},
    {"type": "function", "function": {"name": "search_flights", "parameters": {
        "type": "object", "properties": {
            "origin": {"type": "string"}, "cabin": {"type": "string", "enum": ["economy", "business"]},
            "trip": {"type": "string", "enum": ["one_way"]}, "note": {"type": "string"}},
        "required": ["origin", "cabin", "trip"]}}},
]
PROMPT = ("<|im_start|>system\n# Tools\n<tools>\n" + "\n".join(json.dumps(t) for t in TOOLS)
          + "\n</tools>\nFor each call:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
          "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
          '{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}\n</tool_call>'
          "<|im_end|>\n<|im_start|>assistant\n")


def ctx() -> ToolContext:
    got = tool_context_or_none(PROMPT)
    assert got is not None
    return got


def test_prompt_parsing_reads_schemas_in_order_and_earlier_call_values() -> None:
    c = ctx()
    assert list(c.tools) == ["get_user_details", "get_reservation_details", "search_flights"]
    sf = c.tools["search_flights"]
    assert sf.keys == ["origin", "cabin", "trip", "note"] and sf.required == ["origin", "cabin", "trip"]
    assert sf.enums == {"cabin": ["economy", "business"], "trip": ["one_way"]}
    assert c.past == {("get_user_details", "user_id"): '"mia_li_3668"'}  # the template's
    assert tool_context_or_none("no tools here <tool_call>") is None      # example is not JSON


def test_the_opening_frame_is_completed() -> None:
    c = ctx()
    assert next_literal(PROMPT + "<tool", c) == '_call>\n{"name": "'
    assert next_literal(PROMPT + "<tool_call>", c) == '\n{"name": "'
    assert next_literal(PROMPT + '<tool_call>\n{"na', c) == 'me": "'
    assert next_literal(PROMPT + "Sure, I can", c) is None
    assert next_literal(PROMPT + '<tool_call>\n[', c) is None  # not the frame: no guess


def test_a_unique_name_prefix_completes_name_frame_and_first_key_with_a_past_value() -> None:
    c = ctx()
    got = next_literal(PROMPT + '<tool_call>\n{"name": "get_u', c)
    assert got == 'ser_details", "arguments": {"user_id": "mia_li_3668"'
    # two names share "get_": only their common prefix is proposed
    assert next_literal(PROMPT + '<tool_call>\n{"name": "get', c) == "_"
    assert next_literal(PROMPT + '<tool_call>\n{"name": "zzz', c) is None


def test_keys_follow_the_schema_and_single_enums_are_filled() -> None:
    c = ctx()
    call = PROMPT + '<tool_call>\n{"name": "search_flights", "arguments": {'
    assert next_literal(call, c) == '"origin": '
    assert next_literal(call + '"origin": "JFK"', c) == ', "cabin": '
    assert next_literal(call + '"origin": "JFK", "cabin": "bus', c) == 'iness"'
    assert next_literal(call + '"origin": "JFK", "cabin": "', c) is None  # two enum values
    assert next_literal(call + '"origin": "JFK", "ca', c) == 'bin": '
    assert next_literal(call + '"origin": "JFK", "cabin": "economy"', c) == ', "trip": '
    assert next_literal(call + '"origin": "JFK", "cabin": "economy", "trip": ', c) == '"one_way"'
    done = call + '"origin": "JFK", "cabin": "economy", "trip": "one_way"'
    assert next_literal(done, c) == "}}\n</tool_call>"
    assert next_literal(done + "}", c) == "}\n</tool_call>"
    assert next_literal(done + "}}\n</tool_call>", c) is None  # closed: nothing open


def test_values_typed_from_an_earlier_call_are_completed() -> None:
    c = ctx()
    call = PROMPT + '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "mia'
    assert next_literal(call, c) == '_li_3668"'
    assert next_literal(call.replace('"mia', '"bob'), c) is None
    nested = PROMPT + '<tool_call>\n{"name": "search_flights", "arguments": {"origin": {"a": '
    assert next_literal(nested, c) is None  # inside a nested value: the copy drafters' job
