"""hoist_volatile: clocks and ids leave the stable prefix, with their information (case B03)."""

from __future__ import annotations

import json
from typing import Any

from prefixgate.rewriter import wire
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.stable import stable_region
from prefixgate.rewriter.volatile_spans import find_spans
from tests.rewriter.helpers import ctx, replay

RULES = "Rule: answer briefly and cite the docs. " * 60


def _b03(minute: str, turns: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are Helper. Now: 2025-03-04 10:{minute}. {RULES}"},
        {"role": "user", "content": "Q1"}]
    if turns > 1:
        msgs += [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    return {"model": "m", "messages": msgs}


def _stable_bytes(body: dict[str, Any], api: str) -> str:
    return json.dumps(stable_region(wire.parse(body, api)))  # type: ignore[arg-type]


def test_turn_two_stable_prefix_is_byte_identical_to_turn_one_b03() -> None:
    r1, r2 = replay([_b03("15", 1), _b03("16", 2)], "openai")
    assert _stable_bytes(r1.body, "openai") == _stable_bytes(r2.body, "openai")
    assert r1.stable_prefix_hash == r2.stable_prefix_hash
    # all of turn 1 except its trailing note is a prefix of turn 2's messages
    assert r1.body["messages"][:-1] == r2.body["messages"][:len(r1.body["messages"]) - 1]


def test_moved_clock_keeps_its_information_at_the_end() -> None:
    r = rewrite_request(_b03("16", 2), "openai", ctx())
    last = r.body["messages"][-1]
    assert last["role"] == "user" and "Now: 2025-03-04 10:16." in last["content"]
    assert "2025-03-04" not in r.body["messages"][0]["content"]
    assert "[see note 1 at the end]" in r.body["messages"][0]["content"]
    assert any("iso_datetime@system" in e.detail for e in r.edits)  # the span is named


def test_conversation_turns_are_never_moved_or_changed() -> None:
    body = _b03("16", 2)
    out = rewrite_request(body, "openai", ctx()).body["messages"]
    assert out[1:len(body["messages"])] == body["messages"][1:]


def test_hoist_off_forwards_the_request_unchanged() -> None:
    body = _b03("16", 2)
    r = rewrite_request(body, "openai", ctx(hoist_volatile=False, canonicalize_tools=False))
    assert r.body is body


def test_anthropic_note_goes_after_tool_results_in_the_last_user_turn() -> None:
    body = {"model": "claude-x", "max_tokens": 9,
            "system": [{"type": "text", "text": "Now: 2025-03-04T10:15:00Z\n" + RULES}],
            "tools": [{"name": "calc", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_9", "name": "calc", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_9", "content": "4"}]}]}
    out = rewrite_request(body, "anthropic", ctx()).body
    last = out["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and "2025-03-04T10:15:00Z" in last[-1]["text"]
    assert isinstance(out["system"], list) and "2025" not in out["system"][0]["text"]


def test_last_user_target_keeps_a_string_content_a_string() -> None:
    body = _b03("16", 2)
    out = rewrite_request(body, "openai", ctx(hoist_target="last_user")).body
    assert len(out["messages"]) == len(body["messages"])
    assert isinstance(out["messages"][-1]["content"], str)
    assert out["messages"][-1]["content"].startswith("Q2\n\n")


def test_learned_volatility_hoists_a_changing_line_detectors_miss() -> None:
    def body(n: int) -> dict[str, Any]:
        sys = f"You are Helper.\nActive agents online: {n} (live count)\n{RULES}"
        return {"model": "m", "messages": [{"role": "system", "content": sys},
                                           {"role": "user", "content": "hi"}]}
    r = replay([body(3), body(7), body(7), body(9)], "openai")
    assert "Active agents" in r[0].body["messages"][0]["content"]  # not known yet
    for later in r[1:]:
        assert "Active agents" not in later.body["messages"][0]["content"]
        assert "Active agents online" in later.body["messages"][-1]["content"]
    assert r[1].stable_prefix_hash == r[2].stable_prefix_hash == r[3].stable_prefix_hash
    assert "Active agents online: 9" in r[3].body["messages"][-1]["content"]


def test_session_memory_holds_hashes_not_prompt_text() -> None:
    r = rewrite_request(_b03("15", 1), "openai", ctx())
    mem = json.dumps([e.memory for e in r.edits])
    assert "Helper" not in mem and "Rule" not in mem and "10:15" not in mem


def test_a_rewritten_system_prompt_is_not_learned_as_volatile() -> None:
    a = {"model": "m", "messages": [{"role": "system", "content": "\n".join(
        f"line {i} alpha" for i in range(20))}, {"role": "user", "content": "hi"}]}
    b = {"model": "m", "messages": [{"role": "system", "content": "\n".join(
        f"line {i} beta" for i in range(20))}, {"role": "user", "content": "hi"}]}
    r = replay([a, b], "openai")
    assert r[1].body is b
    assert any("treated as a new prompt" in e.detail for e in r[1].edits)


def test_dates_without_time_of_day_and_flight_times_are_not_volatile() -> None:
    assert find_spans("Born 1990-04-05. Flights depart 06:00:00 daily.") == []
    kinds = [s.kind for s in find_spans(
        "session_id: a1b2c3d4e5f6a7b8c9d0 at Tue, 04 Mar 2025 10:15:00 +0000, "
        "trace 123e4567-e89b-12d3-a456-426614174000, current time 10:15 pm")]
    assert kinds == ["labelled_id", "rfc2822", "uuid", "labelled_time"]


def test_changed_tool_definition_is_reported_not_edited() -> None:
    def body(desc: str) -> dict[str, Any]:
        return {"model": "m", "tools": [{"type": "function", "function": {
            "name": "t", "description": desc, "parameters": {"type": "object"}}}],
                "messages": [{"role": "user", "content": "hi"}]}
    r = replay([body("v1"), body("v2")], "openai")
    assert r[1].body["tools"][0]["function"]["description"] == "v2"
    assert any(e.region == "tools" and "changed" in e.detail for e in r[1].edits)


def test_example_values_in_instructions_are_not_treated_as_volatile() -> None:
    assert find_spans("Dates use ISO format, e.g. 2024-01-01T00:00:00Z.") == []
    assert find_spans("Timestamps look like 2024-01-01 10:00 in logs.") == []
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Reply with times such as 2024-01-01 10:00 only."},
        {"role": "user", "content": "hi"}]}
    assert rewrite_request(body, "openai", ctx()).body is body


def test_learned_span_inside_a_long_line_moves_only_the_changed_words() -> None:
    def body(n: int) -> dict[str, Any]:
        line = (f"You are Helper for ACME support and there are {n} agents online right now; "
                + "always be concise and precise, cite the handbook, never guess. " * 12)
        return {"model": "m", "messages": [{"role": "system", "content": line + "\n" + RULES},
                                           {"role": "user", "content": "hi"}]}
    r = replay([body(3), body(17), body(42)], "openai")
    sys2, sys3 = (x.body["messages"][0]["content"] for x in r[1:])
    assert sys2 == sys3 and "agents online" in sys3 and "42" not in sys3
    assert "[see note 1 at the end]" in sys3
    note = r[2].body["messages"][-1]["content"]
    assert "42" in note and len(note) < 600  # context around the value, not the whole line


def test_a_hoisted_always_call_line_still_keeps_its_tool_through_prune_tools() -> None:
    # the fuzzer's class: learned volatility moved "Always call X" into the note at the end,
    # then prune_tools (which runs after hoist) no longer saw X named and pruned it
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"record kind {i}",
                                               "parameters": {"type": "object"}}} for i in range(40)]

    def body(k: int) -> dict[str, Any]:
        sys = f"You are Helper.\nAlways call tool_{k} before answering.\n{RULES}"
        return {"model": "m", "tools": tools, "messages": [{"role": "system", "content": sys},
                                                           {"role": "user", "content": "weather in Paris?"}]}
    r = replay([body(3), body(7), body(9), body(39)], "openai", prune_tools=True,
               prune_tools_min_catalog=5)
    assert "Always call tool_39" not in r[3].body["messages"][0]["content"]  # hoisted
    assert "tool_39" in {t["function"]["name"] for t in r[3].body["tools"]}
    assert len(r[3].body["tools"]) < len(tools)  # pruning did run
