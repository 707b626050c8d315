"""render(parse(body)) is key-order identical to body for every real request we have."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from tests.trace_requests import anthropic_fixture_bodies, swe_requests, tau_requests


def _same_bytes(body: dict[str, Any], api: Api) -> None:
    out = wire.render(wire.parse(body, api))
    assert json.dumps(out) == json.dumps(body)


def test_anthropic_tool_runner_fixtures_round_trip_byte_identical() -> None:
    bodies = anthropic_fixture_bodies()
    assert len(bodies) >= 10
    for body in bodies:
        _same_bytes(body, "anthropic")


def test_every_tau_bench_request_round_trips_byte_identical() -> None:
    runs = tau_requests()
    assert sum(len(r) for r in runs) > 2000
    for run in runs:
        for body in run:
            _same_bytes(body, "openai")


def test_swe_agent_requests_round_trip_with_extra_message_keys() -> None:
    reqs = swe_requests()
    assert reqs and any("thought" in m for m in reqs[-1]["messages"])
    for body in reqs:
        _same_bytes(body, "openai")


def test_openai_leading_system_messages_become_the_system_region() -> None:
    body = {"model": "m", "messages": [
        {"role": "developer", "content": "d"}, {"role": "system", "content": [
            {"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "u"}, {"role": "system", "content": "late"}]}
    p = wire.parse(body, "openai")
    assert [m.role for m in p.system] == ["developer", "system"]
    assert [m.role for m in p.messages] == ["user", "system"]
    _same_bytes(body, "openai")


def test_block_list_system_with_marker_stays_a_list_b02() -> None:
    body = {"model": "claude-x", "max_tokens": 32, "stream": True,
            "system": [{"type": "text", "text": "static", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "short session note"}],
            "messages": [{"role": "user", "content": "Hello"}]}
    p = wire.parse(body, "anthropic")
    assert p.system[0].form == "list"
    assert p.system[0].blocks[0].cache_control == {"type": "ephemeral"}
    out = wire.render(p)
    assert isinstance(out["system"], list) and out["system"][0]["cache_control"]
    single = {"model": "c", "system": [{"type": "text", "text": "only"}], "messages": []}
    assert wire.render(wire.parse(single, "anthropic"))["system"] == [
        {"type": "text", "text": "only"}]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("body", [
    {},
    {"model": "m"},
    {"messages": "not a list", "tools": {"x": 1}},
    {"messages": [1, 2]},
    {"messages": [{"role": "user", "content": [1, "a"]}]},
    {"messages": [{"role": "user", "content": 5}], "system": 7},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": None}]},
    {"messages": [{"role": "assistant", "tool_calls": [{"id": "a"}], "z": 1}], "tools": []},
])
def test_odd_shapes_pass_through_untouched(body: dict[str, Any], api: Api) -> None:
    _same_bytes(body, api)


def test_image_blocks_are_referenced_not_copied() -> None:
    data = "A" * 100_000
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "describe"}]}]}
    p = wire.parse(body, "anthropic")
    img = p.messages[0].blocks[0]
    assert img.is_opaque and img.text == ""
    assert img.raw is body["messages"][0]["content"][0]
    assert wire.render(p)["messages"][0]["content"][0] is img.raw


def test_removing_every_tool_call_drops_the_key_not_an_empty_list() -> None:
    from dataclasses import replace
    body = {"model": "m", "messages": [{"role": "assistant", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}
    p = wire.parse(body, "openai")
    m = p.messages[0]
    p = replace(p, messages=(m.with_blocks([b for b in m.blocks if b.type != "tool_use"]),))
    assert wire.render(p)["messages"][0] == {"role": "assistant", "content": "x"}
    kept = {"model": "m", "messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}
    _same_bytes(kept, "openai")
