"""Issue 8, class 5: numbers keep their exact JSON text through parse -> rewrite -> serialise ->
translate (a tool_use ``order_id`` of 30 digits once arrived as ``1.2345678901234568e+29``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.proxy.core import exactjson
from prefixgate.proxy.http.body import parse_json
from prefixgate.rewriter.types import Edit, RewriteResult
from tests.proxy.upstream import Script, completion

BIG = "123456789012345678901234567890"
NUMBERS = [BIG, "-" + BIG, "18446744073709551616", "-9223372036854775809", "1.10", "1e5",
           "1E400", "-1E400", "-0", "2.50e-3", "0.1000000000000000055511151231257827",
           "100000000000000000000.0", "1e-400"]


def _orjson_changes(raw: bytes) -> bool:
    try:
        return orjson.dumps(orjson.loads(raw)) != raw
    except orjson.JSONDecodeError:  # 1E400: refused outright
        return True


@pytest.mark.parametrize("token", NUMBERS)
def test_number_text_orjson_would_change_survives_loads_dumps(token: str) -> None:
    raw = ('{"input":{"order_id":' + token + '},"a":[' + token + "]}").encode()
    assert _orjson_changes(raw)  # what happened before
    assert exactjson.dumps(exactjson.loads(raw)) == raw


def test_integer_beyond_64_bits_is_a_real_int_with_its_value() -> None:
    v = parse_json(b'{"order_id": ' + BIG.encode() + b"}")["order_id"]
    assert isinstance(v, int) and v == int(BIG) and v + 1 == int(BIG) + 1


def test_exact_numbers_survive_deepcopy_and_stdlib_json() -> None:
    body = exactjson.loads(b'{"a":[1.10,' + BIG.encode() + b"]}")
    assert exactjson.dumps(copy.deepcopy(body)) == b'{"a":[1.10,' + BIG.encode() + b"]}"
    assert json.loads(json.dumps(body)) == {"a": [1.1, int(BIG)]}  # passes that json.dumps


def test_compact_body_with_ordinary_floats_never_takes_the_slow_parser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(*a: Any, **k: Any) -> Any:
        raise AssertionError("the stdlib parser ran on a body orjson reads exactly")

    monkeypatch.setattr(exactjson.json, "loads", slow)
    raw = orjson.dumps({"model": "m", "temperature": 0.7, "top_p": 0.95, "max_tokens": 5,
                        "messages": [{"role": "user", "content": "1.10 1e5 -0 " + BIG}]})
    assert exactjson.loads(raw) == orjson.loads(raw)
    spaced = json.dumps({"max_tokens": 5, "messages": [{"content": "2024-05-01"}]})
    assert exactjson.loads(spaced.encode()) == orjson.loads(spaced)  # no float: no slow parse


def test_invalid_json_is_still_rejected() -> None:
    for raw in (b'{"a": NaN}', b'{"a": 1', b'{"a": "\\ud800"}', b"\xff"):
        with pytest.raises(ValueError):
            exactjson.loads(raw)


def test_plain_int_beyond_64_bits_made_by_a_pass_is_written_exactly() -> None:
    assert exactjson.dumps({"n": 10 ** 30, "m": [-(10 ** 25)]}) == (
        b'{"n":1000000000000000000000000000000,"m":[-10000000000000000000000000]}')


NUMBER_TOKEN = st.from_regex(r"\A-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?\Z")
KEYS = st.text(alphabet="abcxyz_", min_size=1, max_size=4)


def _json_text(tree: Any, spaced: bool) -> str:
    """Render a tree whose numbers are raw tokens (str wrapped in a tuple) as JSON text."""
    sep, col = (", ", ": ") if spaced else (",", ":")
    if isinstance(tree, tuple):
        return tree[0]
    if isinstance(tree, dict):
        return "{" + sep.join(json.dumps(k) + col + _json_text(v, spaced)
                              for k, v in tree.items()) + "}"
    if isinstance(tree, list):
        return "[" + sep.join(_json_text(v, spaced) for v in tree) + "]"
    return json.dumps(tree, ensure_ascii=False)


TREES = st.recursive(
    NUMBER_TOKEN.map(lambda t: (t,)) | st.text(max_size=8) | st.booleans() | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, TREES, min_size=1, max_size=4), st.booleans())
def test_every_number_token_keeps_its_text(tree: dict[str, Any], spaced: bool) -> None:
    raw = _json_text(tree, spaced).encode()
    assert exactjson.dumps(exactjson.loads(raw)) == _json_text(tree, False).encode()


# --- through the proxy: rewrite (re-serialised) and both bridges ----------------------------

TOOL_INPUT = '{"order_id":' + BIG + ',"price":1.10,"qty":1e5}'


def _anthropic_body() -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 64, "messages": [
        {"role": "user", "content": "order?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get",
                                           "input": "@INPUT@"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "ok"}]}]}


def _raw(body: dict[str, Any], model: str) -> bytes:
    body = {**body, "model": model}
    return json.dumps(body).replace('"@INPUT@"', TOOL_INPUT).encode()


def _add_user_turn(body: dict[str, Any], api: Any, ctx: Any) -> RewriteResult:
    changed = {**body, "messages": [*body["messages"], {"role": "user", "content": "again"}]}
    return RewriteResult(changed, [Edit("test_pass", True, "messages", "added a turn")])


def test_rewritten_body_sends_numbers_with_their_original_text(rig_factory: Any) -> None:
    rig = rig_factory(rewrite_fn=_add_user_turn)
    rig.upstream.script = Script(body={"id": "msg_1", "type": "message", "role": "assistant",
                                       "content": [], "stop_reason": "end_turn",
                                       "usage": {"input_tokens": 1, "output_tokens": 1}})
    r = httpx.post(rig.url + "/v1/messages", content=_raw(_anthropic_body(), "claude-x"),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert TOOL_INPUT.encode() in rig.upstream.seen[-1].raw
    assert b'"content":"again"' in rig.upstream.seen[-1].raw  # it was re-serialised


def test_a2o_bridge_sends_tool_input_numbers_exactly_in_arguments(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    r = httpx.post(rig.url + "/v1/messages", content=_raw(_anthropic_body(), "m1"),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    sent = rig.upstream.seen[-1].json
    assert sent["messages"][1]["tool_calls"][0]["function"]["arguments"] == TOOL_INPUT


def test_o2a_bridge_sends_arguments_numbers_exactly_in_tool_input(rig: Any) -> None:
    rig.upstream.script = Script(body={"id": "msg_1", "type": "message", "role": "assistant",
                                       "content": [{"type": "tool_use", "id": "t2",
                                                    "name": "get", "input": {}}],
                                       "stop_reason": "tool_use",
                                       "usage": {"input_tokens": 1, "output_tokens": 1}})
    body = {"model": "claude-x", "messages": [
        {"role": "user", "content": "order?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "get", "arguments": TOOL_INPUT}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"}]}
    r = httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert b'"input":' + TOOL_INPUT.encode() in rig.upstream.seen[-1].raw


def test_bridged_answers_keep_tool_argument_numbers_exact() -> None:
    from prefixgate.proxy.bridges.anthropic_openai import response_to_anthropic
    from prefixgate.proxy.bridges.openai_anthropic import response_to_openai

    anthropic = exactjson.loads(
        '{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use",'
        '"id":"t2","name":"get","input":' + TOOL_INPUT + '}],"stop_reason":"tool_use",'
        '"usage":{"input_tokens":1,"output_tokens":1}}')
    out = response_to_openai(anthropic, "claude-x")
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == TOOL_INPUT
    openai = completion()
    openai["choices"][0]["message"]["tool_calls"] = [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": TOOL_INPUT}}]
    msg = exactjson.dumps(response_to_anthropic(openai, "m"))
    assert b'"input":' + TOOL_INPUT.encode() in msg


def test_bridged_answer_through_the_proxy_keeps_a_big_integer(rig: Any) -> None:
    rig.upstream.script = Script(body={
        "id": "msg_1", "type": "message", "role": "assistant", "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "t2", "name": "get",
                     "input": {"order_id": int(BIG)}}],
        "usage": {"input_tokens": 1, "output_tokens": 1}})  # json.dumps writes the int exactly
    body = {"model": "claude-x", "messages": [{"role": "user", "content": "order?"}]}
    r = httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30)
    args = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert args == '{"order_id":' + BIG + "}"


def test_exact_number_of_the_wrong_type_is_named_by_its_json_type() -> None:
    from prefixgate.proxy.core.errors import InvalidRequest
    from prefixgate.proxy.http.body import check_anthropic

    with pytest.raises(InvalidRequest) as e:
        check_anthropic(parse_json(b'{"model":"m","max_tokens":1e3,"messages":[]}'))
    assert e.value.param == "max_tokens" and "got number" in e.value.message
