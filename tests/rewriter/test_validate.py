"""Validators name each API rule a rewritten request could break."""

from __future__ import annotations

from typing import Any

from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from prefixgate.rewriter.wire.validate import introduced, violations


def _kinds(body: dict[str, Any], api: Api) -> set[str]:
    return {k for k, _ in violations(wire.parse(body, api))}


def test_openai_unanswered_tool_call_and_orphan_tool_message_b15_b16() -> None:
    call = {"id": "call_a", "type": "function", "function": {"name": "w", "arguments": "{}"}}
    tools = [{"type": "function", "function": {"name": "w"}}]
    ok = {"tools": tools, "messages": [{"role": "user", "content": "x"},
                                       {"role": "assistant", "content": None, "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": "call_a", "content": "r"}]}
    assert _kinds(ok, "openai") == set()
    unanswered = {"tools": tools, "messages": ok["messages"][:2]}
    assert "unanswered_tool_use" in _kinds(unanswered, "openai")
    orphan = {"tools": tools, "messages": [ok["messages"][0], ok["messages"][2]]}
    assert "orphan_tool_result" in _kinds(orphan, "openai")


def test_anthropic_tool_result_must_come_first_in_the_next_user_turn() -> None:
    tools = [{"name": "w", "input_schema": {"type": "object"}}]
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w",
                                             "input": {}}]}
    late = {"tools": tools, "messages": [{"role": "user", "content": "x"}, use, {
        "role": "user", "content": [{"type": "text", "text": "hi"},
                                    {"type": "tool_result", "tool_use_id": "t1"}]}]}
    assert _kinds(late, "anthropic") == {"tool_result_not_first"}
    missing = {"tools": tools, "messages": [{"role": "user", "content": "x"}, use,
                                            {"role": "user", "content": "next"}]}
    assert "unanswered_tool_use" in _kinds(missing, "anthropic")


def test_empty_messages_empty_text_blocks_and_bad_roles() -> None:
    body = {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": [
        {"type": "text", "text": ""}]}, {"role": "tool", "content": "s"}]}
    assert {"empty_message", "empty_text_block", "bad_role"} <= _kinds(body, "anthropic")


def test_a_mid_conversation_system_message_is_a_valid_anthropic_role() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "s"},
                         {"role": "assistant", "content": "ok"}]}
    assert "bad_role" not in _kinds(body, "anthropic")


def test_undefined_tools_and_tool_choice_b06() -> None:
    body = {"tools": [{"name": "send_email", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "gone"},
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}
    assert {"undefined_tool", "tool_choice_undefined"} <= _kinds(body, "anthropic")


def test_more_than_four_breakpoints_and_ttl_order() -> None:
    cc5, cc1 = {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}
    blocks = [{"type": "text", "text": str(i), "cache_control": cc5} for i in range(4)]
    body = {"system": blocks + [{"type": "text", "text": "x", "cache_control": cc1}],
            "messages": [{"role": "user", "content": "x"}]}
    assert {"too_many_breakpoints", "ttl_order"} <= _kinds(body, "anthropic")


def test_introduced_ignores_what_the_client_already_broke() -> None:
    body = {"messages": [{"role": "user", "content": ""}]}
    p = wire.parse(body, "anthropic")
    assert violations(p) and introduced(p, p) == []
