"""What an answer decided (prefixgate/cache/guard/decisions.py), for each API's non-streamed
body: tool calls by name and canonical arguments, text by its first N tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefixgate.cache.guard.decisions import changed, decision_of


def chat_tool(name: str, args: str, text: str | None = None) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": text, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]}}]}


def chat_text(text: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "length"}]}


def anthropic(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": list(blocks)}


def responses(*items: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"object": "response", "status": status, "output": list(items)}


def r_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def r_call(name: str, args: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": "c", "name": name, "arguments": args}


ARGS = {"city": "Oslo", "units": {"t": "C", "w": "m/s"}, "days": [1, 2]}
REORDERED = json.dumps({"days": [1, 2], "units": {"w": "m/s", "t": "C"}, "city": "Oslo"}, indent=2)


@pytest.mark.parametrize("api, same, reordered, other", [
    ("openai", chat_tool("weather", json.dumps(ARGS)), chat_tool("weather", REORDERED, "sure"),
     chat_tool("weather", json.dumps({**ARGS, "city": "Bergen"}))),
    ("anthropic", anthropic({"type": "tool_use", "id": "t", "name": "weather", "input": ARGS}),
     anthropic({"type": "text", "text": "Let me look."},
               {"type": "tool_use", "id": "u", "name": "weather", "input": json.loads(REORDERED)}),
     anthropic({"type": "tool_use", "id": "t", "name": "weather", "input": {**ARGS, "days": [2, 1]}})),
    ("responses", responses(r_call("weather", json.dumps(ARGS))),
     responses({"type": "reasoning", "summary": []}, r_call("weather", REORDERED)),
     responses(r_call("weather", json.dumps({**ARGS, "units": {"t": "F", "w": "m/s"}})))),
])
def test_tool_calls_compare_by_name_and_canonical_arguments(api: str, same: Any, reordered: Any,
                                                          other: Any) -> None:
    a = decision_of(same, api, 16)
    assert a == 'tool:weather{"city":"Oslo","days":[1,2],"units":{"t":"C","w":"m/s"}}'
    assert not changed(a, decision_of(reordered, api, 16))
    assert changed(a, decision_of(other, api, 16))


def test_a_different_tool_name_or_order_of_calls_is_a_change() -> None:
    one = decision_of(anthropic({"type": "tool_use", "name": "a", "input": {}},
                                {"type": "tool_use", "name": "b", "input": {"x": 1}}), "anthropic", 16)
    assert one == 'tool:a{}\ntool:b{"x":1}'
    two = decision_of(anthropic({"type": "tool_use", "name": "b", "input": {"x": 1}},
                                {"type": "tool_use", "name": "a", "input": {}}), "anthropic", 16)
    assert changed(one, two)
    assert changed(decision_of(chat_tool("a", "{}"), "openai", 16),
                   decision_of(chat_tool("b", "{}"), "openai", 16))


def test_arguments_cut_off_mid_json_are_compared_raw() -> None:
    assert decision_of(chat_tool("f", '{"q": "abc'), "openai", 16) == 'tool:f{"q": "abc'
    assert changed(decision_of(chat_tool("f", '{"q": "abc'), "openai", 16),
                   decision_of(chat_tool("f", '{"q": "abd'), "openai", 16))


@pytest.mark.parametrize("api, make", [
    ("openai", chat_text),
    ("anthropic", lambda t: anthropic({"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": t})),
    ("responses", lambda t: responses({"type": "reasoning", "summary": [], "content": [
        {"type": "reasoning_text", "text": "thinking hard"}]}, r_text(t), status="incomplete")),
])
def test_text_compares_its_first_n_tokens_casefolded(api: str, make: Any) -> None:
    base = decision_of(make("The answer is  42,\nsurely. More words"), api, 4)
    assert base == "text:the answer is 42,"
    assert not changed(base, decision_of(make("the ANSWER\tis 42, perhaps"), api, 4))  # token 5 differs
    assert changed(base, decision_of(make("The answer is 43, surely."), api, 4))  # token 4 differs
    assert changed(base, decision_of(make("The answer is"), api, 4))  # fewer than N tokens
    assert decision_of(make("Straße"), api, 4) == "text:strasse"


def test_chat_content_as_parts_is_read() -> None:
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]
    assert decision_of(chat_text(parts), "openai", 16) == "text:hello world"


@pytest.mark.parametrize("api, body, want", [
    ("openai", {"error": {"message": "x", "type": "rate_limit_error"}}, "error:rate_limit_error"),
    ("openai", {"choices": []}, "error:empty"),
    ("openai", chat_text("   "), "error:empty"),
    ("anthropic", {"type": "error", "error": {"type": "overloaded_error", "message": "m"}}, "error:overloaded_error"),
    ("anthropic", anthropic(), "error:empty"),
    ("responses", {"status": "failed", "error": {"code": "server_error", "message": "m"}, "output": []},
     "error:server_error"),
    ("responses", {"status": "failed", "error": None, "output": [r_text("partial")]}, "error:failed"),
    ("responses", responses(), "error:empty"),
])
def test_errors_and_empty_answers(api: str, body: Any, want: str) -> None:
    assert decision_of(body, api, 16) == want


def test_unknown_api_and_bad_n_are_refused() -> None:
    with pytest.raises(ValueError):
        decision_of(chat_text("x"), "gemini", 16)
    with pytest.raises(ValueError):
        decision_of(chat_text("x"), "openai", 0)
