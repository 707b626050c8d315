"""What an answer decided (prefixgate/cache/guard/decisions.py), for each API's non-streamed
body: tool calls by name and canonical arguments, text by its first N tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefixgate.cache.guard.decisions import changed, decided, decision_of


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
    # an error object naming neither its type nor a code
    ("openai", {"error": {"message": "boom"}}, "error:error"),
    ("responses", {"status": "failed", "error": {"message": "m"}, "output": []}, "error:error"),
    # an error that is not an object
    ("responses", {"status": "failed", "error": "boom", "output": []}, "error:boom"),
    # an error body with no error object: its text is not read as an answer
    ("anthropic", {"type": "error", "content": [{"type": "text", "text": "hi"}]}, "error:failed"),
    ("anthropic", {"type": "error", "error": None}, "error:failed"),
])
def test_errors_and_empty_answers(api: str, body: Any, want: str) -> None:
    assert decision_of(body, api, 16) == want


@pytest.mark.parametrize("api", ["gemini", "OpenAI", ""])
def test_an_unknown_api_is_refused_by_name(api: str) -> None:
    with pytest.raises(ValueError, match=f"api must be one of .*got '{api}'"):
        decision_of(chat_text("x"), api, 16)


@pytest.mark.parametrize("n", [0, -1])
def test_fewer_than_one_token_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match=f"first_tokens must be >= 1, got {n}$"):
        decision_of(chat_text("x"), "openai", n)


@pytest.mark.parametrize("n, want", [
    (1, "text:one"), (2, "text:one two"), (4, "text:one two three four"),
    (5, "text:one two three four five"), (6, "text:one two three four five"),
])
def test_the_token_count_counts_from_one(n: int, want: str) -> None:
    assert decision_of(chat_text("One two\nTHREE  four five"), "openai", n) == want


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("answer", [["choices"], "not an object", None, 42])
def test_an_answer_that_is_not_an_object_is_not_json(api: str, answer: Any) -> None:
    assert decision_of(answer, api, 16) == "error:not_json"


def chat_legacy(name: str, args: str, **message: Any) -> dict[str, Any]:
    """A Chat Completions answer with the deprecated ``function_call`` (plus ``message`` fields)."""
    return {"choices": [{"message": {"role": "assistant", "content": None,
                                     "function_call": {"name": name, "arguments": args}, **message}}]}


def test_a_legacy_function_call_decides_like_the_same_tool_call() -> None:
    args = '{"b": 1, "a": [true, null]}'
    legacy = decision_of(chat_legacy("lookup", args), "openai", 16)
    assert legacy == 'tool:lookup{"a":[true,null],"b":1}'
    assert not changed(legacy, decision_of(chat_tool("lookup", '{"a":[true,null],"b":1}'), "openai", 16))
    assert changed(legacy, decision_of(chat_legacy("find", args), "openai", 16))
    assert changed(legacy, decision_of(chat_legacy("lookup", '{"b": 2, "a": [true, null]}'), "openai", 16))
    assert decision_of(chat_legacy("f", '{"q": "cut'), "openai", 16) == 'tool:f{"q": "cut'


def test_tool_calls_win_over_a_legacy_function_call() -> None:
    both = chat_legacy("old", "{}", tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "new", "arguments": '{"x": 1}'}}])
    assert decision_of(both, "openai", 16) == 'tool:new{"x":1}'
    # tool_calls holding no call object: the legacy call is read
    stray = chat_legacy("old", '{"y": 2}', tool_calls=["not a call"])
    assert decision_of(stray, "openai", 16) == 'tool:old{"y":2}'


@pytest.mark.parametrize("api, make", [
    ("openai", lambda args: chat_tool("f", json.dumps(args))),
    ("openai", lambda args: chat_tool("f", json.dumps(args, ensure_ascii=False))),
    ("anthropic", lambda args: anthropic({"type": "tool_use", "id": "t", "name": "f", "input": args})),
    ("responses", lambda args: responses(r_call("f", json.dumps(args)))),
])
def test_non_ascii_arguments_are_kept_as_characters(api: str, make: Any) -> None:
    got = decision_of(make({"city": "Tromsø", "note": "日本 ✓"}), api, 16)
    assert got == 'tool:f{"city":"Tromsø","note":"日本 ✓"}'
    assert changed(got, decision_of(make({"city": "Tromso", "note": "日本 ✓"}), api, 16))


def _parts_answer(api: str, parts: list[Any]) -> dict[str, Any]:
    if api == "openai":
        return chat_text(parts)
    if api == "anthropic":
        return anthropic(*parts)
    return responses({"type": "message", "role": "assistant", "content": parts})


@pytest.mark.parametrize("api, kinds", [
    ("openai", ("text", "text")),
    ("anthropic", ("text", "text")),
    ("responses", ("output_text", "text")),
    ("responses", ("text", "output_text")),
])
def test_only_text_parts_with_text_are_read(api: str, kinds: tuple[str, str]) -> None:
    """Parts with empty or null text add nothing; parts of another type (reasoning, an image)
    and parts that are not objects are skipped even when they carry a ``text`` (a refusal part
    is a decision of its own: test_a_refusal_is_a_decision_of_its_own)."""
    a, b = kinds
    parts = [{"type": a, "text": None}, {"type": a, "text": ""}, {"type": a},
             {"type": "reasoning_text", "text": "hidden"}, "stray", ["also stray"],
             {"type": a, "text": "Hello "}, {"type": "image", "text": "nope"},
             {"type": b, "text": "World"}]
    assert decision_of(_parts_answer(api, parts), api, 16) == "text:hello world"
    assert decision_of(_parts_answer(api, parts[:6]), api, 16) == "error:empty"


def test_responses_message_items_are_read_in_order() -> None:
    two = decision_of(responses(r_text("Hello "), {"type": "reasoning", "summary": []}, r_text("world")),
                      "responses", 16)
    assert two == "text:hello world"
    assert decision_of(responses(r_text("world "), r_text("Hello")), "responses", 16) == "text:world hello"


# --- refusals decide; errors and empty answers do not ------------------------------------------

def chat_refusal(refusal: Any, content: Any = None) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": content, "refusal": refusal}}]}


@pytest.mark.parametrize("api, refused, empty", [
    ("openai", chat_refusal("I can't help with that."), chat_text(None)),
    ("openai", chat_text([{"type": "refusal", "refusal": "No."}]), chat_text([])),
    ("anthropic", {"type": "message", "content": [], "stop_reason": "refusal"},
     {"type": "message", "content": [], "stop_reason": "end_turn"}),
    ("anthropic", {"type": "message", "content": [{"type": "text", "text": "I won't"}],
                   "stop_reason": "refusal"},
     {"type": "message", "content": [{"type": "text", "text": "I won't"}], "stop_reason": "end_turn"}),
    ("responses", responses({"type": "message", "role": "assistant",
                             "content": [{"type": "refusal", "refusal": "No."}]}),
     responses({"type": "message", "role": "assistant", "content": []})),
])
def test_a_refusal_is_a_decision_of_its_own(api: str, refused: Any, empty: Any) -> None:
    """A refusal is neither an empty answer nor text: a variant that makes the model refuse
    (or stop refusing) is a change, whatever the refusal's wording."""
    d = decision_of(refused, api, 4)
    assert d == "refusal"
    assert changed(d, decision_of(empty, api, 4))
    assert decision_of(empty, api, 4) in ("error:empty", "text:i won't")


def test_a_refusals_wording_does_not_count_and_calls_still_win() -> None:
    assert decision_of(chat_refusal("No."), "openai", 4) == decision_of(chat_refusal("Sorry, no"), "openai", 4)
    for blank in ("", "  ", None, 7):                      # no refusal text: not a refusal
        assert decision_of(chat_refusal(blank, "hi there"), "openai", 4) == "text:hi there"
    with_call = chat_tool("f", "{}")
    with_call["choices"][0]["message"]["refusal"] = "No."
    assert decision_of(with_call, "openai", 4) == "tool:f{}"
    r = responses({"type": "message", "content": [{"type": "output_text", "text": "ok"}]},
                  {"type": "message", "content": [{"type": "refusal", "refusal": "no"}]})
    assert decision_of(r, "responses", 4) == "refusal"
    not_parts = responses({"type": "message", "content": {"type": "refusal", "refusal": "no"}},
                          {"type": "message", "content": ["refusal", {"type": "output_text", "text": "ok"}]})
    assert decision_of(not_parts, "responses", 4) == "text:ok"


@pytest.mark.parametrize("decision, want", [
    ("error:empty", False), ("error:rate_limit_error", False), ("error:not_json", False),
    ("error:", False), ("refusal", True), ("text:yes", True), ("tool:f{}", True),
    ("text:error: shown as text", True), ("", True),
])
def test_only_errors_and_empty_answers_decided_nothing(decision: str, want: bool) -> None:
    assert decided(decision) is want
