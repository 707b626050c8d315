"""Thinking, document, image and prefill shapes: kept intact, never marked where not allowed."""

from __future__ import annotations

import json
from typing import Any

from prefixgate.rewriter.pipeline import rewrite_request
from tests.rewriter.helpers import clock_session, ctx

BIG = "Static reference text for the assistant to follow. " * 300


def _thinking_body() -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "system": BIG,
            "tools": [{"name": "calc", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                    "data": "doc"}},
                    {"type": "text", "text": "2+2?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "add", "signature": "sig=="},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]}]}


def test_thinking_blocks_pass_through_and_are_never_marked() -> None:
    body = _thinking_body()
    out = rewrite_request(body, "anthropic", ctx("anthropic")).body
    assistant = out["messages"][1]["content"]
    assert assistant == body["messages"][1]["content"]  # signatures and order untouched
    assert out["messages"][2]["content"][0].get("cache_control") == {"type": "ephemeral"}
    assert out["thinking"] == body["thinking"]


def test_marker_walks_back_past_unmarkable_blocks() -> None:
    body = _thinking_body()
    body["messages"] = body["messages"][:1] + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "t", "signature": "s"}]}]
    out = rewrite_request(body, "anthropic", ctx("anthropic")).body
    assert "cache_control" not in out["messages"][1]["content"][0]
    assert out["messages"][0]["content"][1]["cache_control"] == {"type": "ephemeral"}


def test_assistant_prefill_stays_last_and_note_goes_to_newest_user_turn() -> None:
    def make(minute: str) -> dict[str, Any]:
        return {"model": "claude-x", "max_tokens": 8, "system": f"Now: 2025-03-04 10:{minute}\n" + BIG,
                "messages": [{"role": "user", "content": "Say hi"},
                             {"role": "assistant", "content": "Hi"}]}
    out = clock_session(make, ["14", "15"], "anthropic", "anthropic")[1].body
    assert out["messages"][-1] == {"role": "assistant", "content": "Hi"}
    assert "2025-03-04 10:15" in json.dumps(out["messages"][0])


def test_openai_block_list_system_with_marker_stays_a_list_b02() -> None:
    body = {"model": "claude-x", "stream": True, "messages": [
        {"role": "system", "content": [{"type": "text", "text": BIG,
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "hi"}]}
    out = rewrite_request(body, "openai", ctx("openai")).body
    assert out["messages"][0] == body["messages"][0]


def test_image_parts_are_not_scanned_for_volatile_text() -> None:
    data = "data:image/png;base64," + "2025-03-04T10:15:00Z" * 10
    body = {"model": "m", "messages": [
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": data}},
                                       {"type": "text", "text": "Stable rules."}]},
        {"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "openai", ctx())
    assert r.body is body
