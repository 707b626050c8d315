"""Issue 8, classes 4 and 6 through a bridge: a client body that maps to nothing the backend's
API accepts is a 400 naming the client's param, before anything is sent; JSON a bridge parses
out of a string (tool-call ``arguments``) is held to ``limits.max_json_depth`` like the body,
and a translated body that cannot be serialised is a 400, never a 500.
A->O = Anthropic client -> OpenAI-compatible backend; O->A = the other way."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.bridges.validity import anthropic_problem, openai_problem
from prefixgate.proxy.core.errors import InvalidRequest, NestingTooDeep, ProxyError
from tests.proxy import bridging


def nested(depth: int) -> str:
    return '{"a":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


def call(args: str, cid: str = "c1") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": "f", "arguments": args}}]}


def tool(cid: str = "c1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": "ok"}


def o2a(*msgs: dict[str, Any], max_depth: int = 128) -> bytes:
    return bridging.encode("openai", {"model": "claude-x", "messages": list(msgs)}, max_depth)


def a2o(*msgs: dict[str, Any]) -> bytes:
    return bridging.encode("anthropic", {"model": "m", "max_tokens": 8, "messages": list(msgs)})


def refusal(fn: Any, *msgs: dict[str, Any], **kw: Any) -> ProxyError:
    with pytest.raises(ProxyError) as e:
        fn(*msgs, **kw)
    assert e.value.status == 400 and e.value.param and f"'{e.value.param}'" in e.value.message
    return e.value


USER = {"role": "user", "content": "go"}
TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}


def tool_result(tid: str = "t1") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": "ok"}]}


# --- nesting of parsed arguments (class 6) ----------------------------------------------------

@pytest.mark.parametrize("depth", [300, 5000])  # 5000: past what any JSON parser here reads
def test_o2a_arguments_nested_past_the_limit_are_400_naming_the_arguments(depth: int) -> None:
    e = refusal(o2a, USER, call(nested(depth)), tool())
    assert isinstance(e, NestingTooDeep) and e.param == "messages[1].tool_calls[0].function.arguments"


def test_o2a_legacy_function_call_arguments_are_held_to_the_same_limit() -> None:
    msg = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": nested(300)}}
    fn = {"role": "function", "name": "f", "content": "ok"}
    assert refusal(o2a, USER, msg, fn).param == "messages[1].function_call.arguments"


def test_o2a_arguments_limit_is_the_policy_max_json_depth() -> None:
    assert b'"input":{"a":[[[' in o2a(USER, call(nested(16)), tool(), max_depth=16)
    assert refusal(o2a, USER, call(nested(17)), tool(), max_depth=16).param.endswith(".arguments")


def test_translated_body_orjson_cannot_write_is_400_from_the_bridge_not_500() -> None:
    # a limit above the schema's 200 lets a parsed argument pass 255 levels in the upstream body
    e = refusal(o2a, USER, call(nested(252)), tool(), max_depth=252)
    assert isinstance(e, InvalidRequest) and "cannot be written as JSON" in e.message


def test_a2o_answer_arguments_too_deep_to_write_are_carried_whole_as_raw() -> None:
    args = nested(300)
    answer = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]},
        "finish_reason": "tool_calls"}]}
    out = bridging.response("anthropic", answer, "m")
    assert out["content"][0]["input"] == {"_raw": args}


# --- structural validity of the translated body (class 4) -----------------------------------

@pytest.mark.parametrize("msgs, param", [
    ([{"role": "user", "content": []}], "messages"),
    ([{"role": "system", "content": "be brief"}], "messages"),
    ([USER, tool()], "messages[1]"),                               # answers no call
    ([USER, call("{}"), USER], "messages[1].tool_calls[0]"),       # call never answered
    ([USER, call("{}"), USER, tool()], "messages[3]"),  # answered after user text
    ([USER, call("{}"), tool(), tool()], "messages[3]"),           # answered twice
])
def test_o2a_body_with_no_valid_messages_counterpart_is_400_naming_the_client_param(
        msgs: list[dict[str, Any]], param: str) -> None:
    assert refusal(o2a, *msgs).param == param


def test_o2a_empty_system_text_part_carries_nothing_and_is_left_out() -> None:
    system = {"role": "system", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "s"}]}
    out = bridging.request("openai", {"model": "claude-x", "messages": [system, USER]})
    assert out["system"] == [{"type": "text", "text": "s"}]


@pytest.mark.parametrize("msgs, param", [
    ([{"role": "user", "content": []}], "messages"),
    ([tool_result()], "messages[0].content[0]"),                   # answers no call
    ([USER, TOOL_USE, USER], "messages[1].content[0]"),            # call never answered
    ([USER, TOOL_USE, {"role": "assistant", "content": "x"}], "messages[1].content[0]"),
])
def test_a2o_body_with_no_valid_chat_completions_counterpart_is_400_naming_the_client_param(
        msgs: list[dict[str, Any]], param: str) -> None:
    assert refusal(a2o, *msgs).param == param


def test_valid_pairings_pass_both_bridges() -> None:
    assert a2o(USER, TOOL_USE, tool_result())
    assert o2a(USER, call('{"x": 1}'), tool(), USER)


@pytest.mark.parametrize("body, why", [
    ({"messages": []}, "nothing"),
    ({"messages": [USER], "system": [{"type": "image"}]}, "text blocks only"),
    ({"messages": [USER], "system": [{"type": "text", "text": ""}]}, "empty text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "empty text"),
    ({"messages": [{"role": "system", "content": "s"}]}, "user and assistant"),
    ({"messages": [USER, TOOL_USE, {"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t1"}]}]}, "come first"),
])
def test_anthropic_rules_name_what_the_messages_api_rejects(body: dict[str, Any], why: str) -> None:
    problem = anthropic_problem(body)
    assert problem is not None and why in problem.why


@pytest.mark.parametrize("body, why", [
    ({"messages": []}, "nothing"),
    ({"messages": [{"role": "user", "content": []}]}, "needs content"),
    ({"messages": [{"role": "user", "content": None}]}, "needs content"),
    ({"messages": [USER, call("{}")]}, "not answered"),
])
def test_openai_rules_name_what_chat_completions_rejects(body: dict[str, Any], why: str) -> None:
    problem = openai_problem(body)
    assert problem is not None and why in problem.why


# --- through the proxy: the caller's shape, nothing sent ------------------------------------

def test_refused_bridge_body_is_400_in_the_callers_shape_and_never_sent(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/chat/completions", json={
        "model": "claude-x", "messages": [{"role": "user", "content": "x"}, call(nested(300)), tool()]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
    r = httpx.post(rig.url + "/v1/messages", json={"model": "m-x", "max_tokens": 8,
                                                   "messages": [tool_result()]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "'messages[0].content[0]'" in r.json()["error"]["message"]
    assert rig.upstream.seen == []


def test_nesting_error_quotes_a_plain_param_name_when_the_path_is_elided() -> None:
    # an Anthropic-shaped error has no param field: the quoted name in the message must be one
    import asyncio
    import re

    from prefixgate.proxy.http.body import check_nesting

    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    with pytest.raises(NestingTooDeep) as e:
        asyncio.run(check_nesting({"x_deep": deep}, 128))
    assert e.value.param == "x_deep[0][0][0][0][0][0][0]"
    assert re.search(r"'[\w.\[\]-]+', 120 levels below it", e.value.message)


@pytest.mark.parametrize("key", ["ù°í?/(", "a b", "x'y", "tab\there\x00", ""])
def test_an_unknown_key_of_any_text_is_quoted_as_one_unbroken_token(key: str) -> None:
    # Anthropic-shaped errors have no param field: the quoted name is how a client reads it
    import re

    with pytest.raises(InvalidRequest) as e:
        bridging.request("anthropic", {"model": "m", "max_tokens": 8, "messages": [USER], key: 1})
    assert e.value.param == key
    assert re.match(r"'[^'\s]+' cannot be translated", e.value.message)
