"""One nesting limit (policy ``limits.max_json_depth``, default 128) applied right after the JSON
parse, before any pass or bridge: deeper bodies are a 400 in the caller's shape naming the limit,
never a 500 from a recursive pass, a bridge or orjson's 255-level serialisation limit; bodies at
the limit go through every pass and both bridges (issue 8 class 6)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.config.loader import PolicyError, parse_policy
from prefixgate.proxy.core.nesting import deeper_than, first_too_deep
from tests.proxy.upstream import Script, completion

ALL_PASSES = {"prune_tools": True, "prune_history": True, "prune_rag": True,
              "tool_schema_sort_properties": True}
ANTHROPIC_ANSWER = {"id": "msg_1", "type": "message", "role": "assistant",
                    "content": [{"type": "text", "text": "ok"}], "model": "claude-x",
                    "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}


def _answer(body: dict[str, Any]) -> Script:
    return Script(body=completion() if "messages" in body and "max_tokens" not in body
                  and not str(body.get("model", "")).startswith("claude") else ANTHROPIC_ANSWER)


def _depth(value: Any) -> int:
    n = 1
    while first_too_deep(value, n) is not None:
        n += 1
    return n


def body_of_depth(path: str, model: str, depth: int) -> bytes:
    """A valid request for ``path`` whose deepest value (a tool's JSON schema) is exactly
    ``depth`` levels deep; built as text so the client's own encoder does not recurse."""
    schema: dict[str, Any] = {"type": "object", "properties": {"p": "@DEEP@"}}
    if path == "/v1/messages":
        body: dict[str, Any] = {"model": model, "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"name": "f", "description": "d", "input_schema": schema}]}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                            "parameters": schema}}]}
    base = _depth(json.loads(json.dumps(body).replace('"@DEEP@"', "{}")))  # p as one level
    extra = depth - base
    assert extra >= 0
    deep = '{"a": ' * extra + "{}" + "}" * extra
    raw = json.dumps(body).replace('"@DEEP@"', deep).encode()
    return raw


ROUTES = [("/v1/chat/completions", "gpt-x"), ("/v1/chat/completions", "claude-x"),
          ("/v1/messages", "claude-x"), ("/v1/messages", "gpt-x")]


@pytest.mark.parametrize("path,model", ROUTES)
@pytest.mark.parametrize("depth", [129, 300, 1000])
def test_body_nested_past_the_limit_is_a_400_naming_the_limit_before_any_pass_or_bridge(
        rig_factory: Any, path: str, model: str, depth: int) -> None:
    rig = rig_factory(rewrite_fn="default", rewrite=ALL_PASSES)
    r = httpx.post(rig.url + path, content=body_of_depth(path, model, depth), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["code"] == "nesting_too_deep"
        assert body["error"]["param"].startswith("tools[0].")
        message = body["error"]["message"]
    assert "128" in message and "max_json_depth" in message
    assert rig.upstream.seen == []


@pytest.mark.parametrize("path,model", ROUTES)
def test_body_exactly_at_the_limit_goes_through_every_pass_and_both_bridges(
        rig_factory: Any, path: str, model: str) -> None:
    rig = rig_factory(rewrite_fn="default", rewrite=ALL_PASSES)
    rig.upstream.script = _answer
    r = httpx.post(rig.url + path, content=body_of_depth(path, model, 128), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert len(rig.upstream.seen) == 1


def test_deep_list_in_tool_result_content_is_refused_not_a_500(rig_factory: Any) -> None:
    # not named by the issue: arrays, not objects, nested inside message content
    rig = rig_factory(rewrite_fn="default", rewrite=ALL_PASSES)
    deep = "[" * 400 + '"x"' + "]" * 400
    raw = ('{"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": '
           '[{"type": "tool_result", "tool_use_id": "t1", "content": ' + deep + '}]}]}')
    r = httpx.post(rig.url + "/v1/messages", content=raw, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].content" in r.json()["error"]["message"]


def test_nesting_limit_comes_from_the_policy(rig_factory: Any) -> None:
    rig = rig_factory(limits={"max_json_depth": 16})
    rig.upstream.script = _answer
    ok = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                    content=body_of_depth("/v1/chat/completions", "gpt-x", 16))
    deep = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                      content=body_of_depth("/v1/chat/completions", "gpt-x", 17))
    assert ok.status_code == 200
    assert deep.status_code == 400 and "16 levels" in deep.json()["error"]["message"]


@pytest.mark.parametrize("depth", [201, 255, 1000])
def test_policy_nesting_limit_must_stay_under_orjsons_serialisation_limit(depth: int) -> None:
    with pytest.raises(PolicyError) as ei:
        parse_policy({"backends": {"b": {"kind": "openai_compat", "base_url": "http://x/v1"}},
                      "routes": [{"match": "*", "backend": "b"}],
                      "limits": {"max_json_depth": depth}})
    assert ei.value.problems[0][0] == "limits.max_json_depth"


def test_depth_check_walks_100k_deep_and_1m_wide_values_without_recursion() -> None:
    deep: Any = "x"
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    path = first_too_deep({"a": deep}, 128)
    assert path is not None and len(path) == 128
    wide = {f"k{i}": [i, {"v": i}] for i in range(1_000_000 // 3)}
    assert first_too_deep(wide, 3) is None and first_too_deep(wide, 2) == ["k0", 1]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner,
                                                                max_size=4),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(min_value=0, max_value=12))
def test_the_level_walk_says_too_deep_exactly_when_the_path_walk_finds_a_path(
        value: Any, limit: int) -> None:
    assert deeper_than(value, limit) == (first_too_deep(value, limit) is not None)
    depth = _depth(value)  # the exact depth: within at it, too deep one below
    assert not deeper_than(value, depth) and deeper_than(value, depth - 1) == (
        isinstance(value, (dict, list)))


def test_the_level_walk_goes_100k_deep_and_1m_wide_without_recursion() -> None:
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    assert deeper_than({"a": deep}, 128) and not deeper_than({"a": deep}, 100_001)
    wide = {f"k{i}": [i, {"v": i}] for i in range(1_000_000 // 3)}
    assert not deeper_than(wide, 3) and deeper_than(wide, 2)


def test_large_body_nested_too_deep_is_refused_by_the_off_loop_check(rig: Any) -> None:
    # bodies over 1 MiB are walked in a worker thread: same answer, same shape
    raw = ('{"model": "gpt-x", "messages": [{"role": "user", "content": "' + "x" * (2 << 20)
           + '"}], "metadata": ' + "[" * 200 + "1" + "]" * 200 + "}")
    r = httpx.post(rig.url + "/v1/chat/completions", content=raw, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("metadata[0]")
    assert rig.upstream.seen == []
