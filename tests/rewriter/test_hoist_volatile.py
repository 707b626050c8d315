"""hoist_volatile: clocks and ids leave the stable prefix, with their information (case B03),
once they are seen changing (issue 19, item 2)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefixgate.config.schema import HOIST_TARGET_BY_API
from prefixgate.rewriter.analysis.note_placement import (
    NOTE_HEADER,
    REMINDER_OPEN,
    note_text,
    resolve,
    values_line,
)
from prefixgate.rewriter.analysis.stable import stable_region
from prefixgate.rewriter.analysis.volatile_spans import find_spans, per_request
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.wire import codec as wire
from tests.rewriter.helpers import clock_session, ctx, replay

RULES = "Rule: answer briefly and cite the docs. " * 60
MINUTES = ["15", "16", "17", "18", "19"]


def _b03(minute: str, turns: int = 2) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are Helper. Now: 2025-03-04 10:{minute}. {RULES}"},
        {"role": "user", "content": "Q1"}]
    if turns > 1:
        msgs += [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    return {"model": "m", "messages": msgs}


def _stable_bytes(body: dict[str, Any], api: str) -> str:
    return json.dumps(stable_region(wire.parse(body, api)))  # type: ignore[arg-type]


def _all_text(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


def test_a_clock_is_left_in_place_until_it_is_seen_changing() -> None:
    first = _b03("15", 1)
    r = rewrite_request(first, "openai", ctx())
    assert r.body is first
    assert any("not seen changing" in e.detail and "iso_datetime" in e.detail for e in r.edits)


def test_from_turn_two_on_the_stable_prefix_is_byte_identical_b03() -> None:
    rs = clock_session(lambda m: _b03(m), MINUTES, "openai")
    assert "10:15" in rs[0].body["messages"][0]["content"]  # turn 1: not yet seen changing
    assert rs[1].stable_prefix_hash != rs[0].stable_prefix_hash  # turn 2 differs either way
    for r in rs[2:]:  # from turn 3 on, the prefix up to the note is reused
        assert _stable_bytes(r.body, "openai") == _stable_bytes(rs[1].body, "openai")
        assert r.stable_prefix_hash == rs[1].stable_prefix_hash
        assert r.body["messages"][1:3] == rs[1].body["messages"][1:3]


def test_moved_clock_keeps_its_information_after_the_stable_prefix() -> None:
    r = clock_session(lambda m: _b03(m), ["15", "16"], "openai", hoist_target="end")[1]
    last = r.body["messages"][-1]
    assert last["role"] == "user" and "Now: 2025-03-04 10:16." in last["content"]
    assert "2025-03-04" not in r.body["messages"][0]["content"]
    assert "[see note 1 at the end]" in r.body["messages"][0]["content"]
    assert any("iso_datetime@system" in e.detail for e in r.edits)  # the span is named


def test_a_constant_clock_line_is_never_hoisted() -> None:
    """The tau-bench policy's own line, identical on every request of the session."""
    policy = "# Airline Agent Policy\n\nThe current time is 2024-05-15 15:00:00 EST.\n\n" + RULES
    bodies = [{"model": "m", "messages": [{"role": "system", "content": policy},
                                          {"role": "user", "content": f"Q{i}"}]} for i in range(6)]
    for body, r in zip(bodies, replay(bodies, "openai")):
        assert r.body is body
        assert not any(e.applied for e in r.edits if e.pass_name == "hoist_volatile")


def test_a_changing_clock_moves_from_the_request_where_it_is_seen_changing() -> None:
    """Constant for three requests, then it ticks: left in place until the tick, moved on the
    tick and on every request after (even when a value repeats: sticky)."""
    values = ["15", "15", "15", "16", "17", "17"]
    rs = clock_session(lambda m: _b03(m), values, "openai")
    moved = ["2025-03-04" not in r.body["messages"][0]["content"] for r in rs]
    assert moved == [False, False, False, True, True, True]


@pytest.mark.parametrize("placement", ["auto", "end", "last_user", "system_end", "reminder", "inline"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_never_two_versions_of_a_fact_in_the_body(placement: str, api: str) -> None:
    """Every request of a ticking session holds its own clock value exactly once, its line's
    label exactly once, and no earlier value."""
    def make(minute: str) -> dict[str, Any]:
        sys = f"# Policy\n\nThe current time is 2024-05-15 15:{minute}:00 EST.\n\n{RULES * 3}"
        msgs = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "Q2"}]
        if api == "anthropic":
            return {"model": "claude-x", "max_tokens": 9, "system": sys, "messages": msgs}
        return {"model": "m", "messages": [{"role": "system", "content": sys}, *msgs]}
    rs = clock_session(make, MINUTES, api, "anthropic" if api == "anthropic" else "radix",  # type: ignore[arg-type]
                       hoist_target=placement)
    assert any(e.applied for e in rs[-1].edits if e.pass_name == "hoist_volatile")
    for k, r in enumerate(rs):
        text = _all_text(r.body)
        moved = any(e.applied for e in r.edits if e.pass_name == "hoist_volatile")
        assert text.count(f"2024-05-15 15:{MINUTES[k]}:00") == 1
        # ``inline`` carries the value without its label (issue 36): the label goes with the move
        assert text.count("The current time is") == (1 - moved if placement == "inline" else 1)
        assert not any(f"15:{m}:00" in text for m in MINUTES[:k])


def test_a_per_request_id_moves_on_the_first_request() -> None:
    sys = f"You are Helper.\nRequest ID: req_8f3a9c2e7b1d4f60a9\n{RULES}"
    body = {"model": "m", "messages": [{"role": "system", "content": sys},
                                       {"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "openai", ctx())
    assert "req_8f3a9c2e7b1d4f60a9" not in r.body["messages"][0]["content"]
    assert "Request ID: req_8f3a9c2e7b1d4f60a9" in json.dumps(r.body["messages"][-1])


@pytest.mark.parametrize(("line", "marked"), [
    ("Request ID: 123e4567-e89b-12d3-a456-426614174000", True),
    ("trace_id=4bf92f3577b34da6a3ce929d0e0e4736", True),
    ("Generated for this request at 2025-03-04 10:15:07", True),
    ("Session ID: 123e4567-e89b-12d3-a456-426614174000", False),
    ("The current time is 2024-05-15 15:00:00 EST.", False),
])
def test_per_request_is_read_from_the_spans_own_line(line: str, marked: bool) -> None:
    text = f"Header line about request ids in general.\n{line}\nFooter."
    if not marked:  # the marker words on another line do not count
        text = "Each request is logged.\n" + text.replace("request ids", "ids")
    sps = find_spans(text)
    assert sps and per_request(text, sps[0]) is marked


def test_a_short_line_moves_whole_and_a_long_one_keeps_a_placeholder() -> None:
    def make(minute: str) -> dict[str, Any]:
        sys = (f"You are Helper.\nThe current time is 2025-03-04 10:{minute}:00 UTC.\n"
               f"Rules: be brief, be kind, and remember it is 2025-03-04 10:{minute}:00 UTC "
               f"for every booking you make today, whatever the user says.\n{RULES}")
        return {"model": "m", "messages": [{"role": "system", "content": sys},
                                           {"role": "user", "content": "hi"}]}
    r = clock_session(make, ["15", "16"], "openai", hoist_target="end")[1]
    sys, note = r.body["messages"][0]["content"], r.body["messages"][-1]["content"]
    assert "The current time is" not in sys and "You are Helper.\nRules: be brief" in sys
    assert "remember it is [see note 1 at the end] for every booking" in sys
    assert note.splitlines()[0] == "The current time is 2025-03-04 10:16:00 UTC."
    assert "[1] Rules: be brief, be kind, and remember it is 2025-03-04 10:16:00 UTC" in note


def test_a_system_block_that_is_only_a_clock_keeps_a_placeholder() -> None:
    def make(minute: str) -> dict[str, Any]:
        return {"model": "claude-x", "max_tokens": 9, "system": [
            {"type": "text", "text": f"Now: 2025-03-04 10:{minute}"}, {"type": "text", "text": RULES * 3}],
            "messages": [{"role": "user", "content": "hi"}]}
    r = clock_session(make, ["15", "16"], "anthropic", "anthropic", model="claude-x")[1]
    assert r.body["system"][0]["text"] == "Now: [see note 1 at the end]"
    assert "[1] Now: 2025-03-04 10:16" in r.body["messages"][-1]["content"][-1]["text"]


def test_auto_placement_is_the_measured_default_per_api() -> None:
    assert resolve("auto", "openai") == HOIST_TARGET_BY_API["openai"]
    assert resolve("auto", "anthropic") == HOIST_TARGET_BY_API["anthropic"]
    assert resolve("system_end", "anthropic") == HOIST_TARGET_BY_API["anthropic"]
    assert resolve("system_end", "openai") == "system_end"
    assert resolve("end", "anthropic") == "end"


def _tool_loop(minute: str) -> dict[str, Any]:
    return {"model": "m", "messages": [
        {"role": "system", "content": f"You are Helper.\nNow: 2025-03-04 10:{minute}\n{RULES}"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"}],
        "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize(("placement", "role", "count"), [
    ("end", "user", 5), ("system_end", "system", 5), ("reminder", "user", 5), ("last_user", "tool", 4),
    ("inline", "user", 5)])
def test_openai_placements_after_a_tool_result(placement: str, role: str, count: int) -> None:
    r = clock_session(_tool_loop, ["15", "16"], "openai", hoist_target=placement)[1]
    msgs = r.body["messages"]
    assert len(msgs) == count and msgs[-1]["role"] == role
    assert msgs[3] == _tool_loop("16")["messages"][3]  # the tool result is never edited
    where = msgs[-1]["content"] if placement != "last_user" else msgs[1]["content"]
    assert ("[2025-03-04 10:16]" == where) if placement == "inline" else "Now: 2025-03-04 10:16" in where
    assert where.startswith(REMINDER_OPEN) is (placement == "reminder")


def test_inline_after_a_user_message_is_its_values_joined_to_it() -> None:
    """``inline`` (issue 36): the moved line's value alone, bracketed, after the user's text;
    the label the system prompt gave it stays behind with nothing else of the line."""
    def make(minute: str) -> dict[str, Any]:
        return {"model": "m", "messages": [
            {"role": "system", "content": f"You are Helper.\nThe current time is 2025-03-04 10:{minute}.\n{RULES}"},
            {"role": "user", "content": "Q1"}]}
    r = clock_session(make, ["15", "16"], "openai", hoist_target="inline")[1]
    msgs = r.body["messages"]
    assert len(msgs) == 2 and msgs[-1]["content"] == "Q1\n\n[2025-03-04 10:16]"
    assert "current time" not in msgs[0]["content"] and "2025" not in msgs[0]["content"]


def test_inline_writes_each_moved_lines_value_on_one_line() -> None:
    assert values_line(["The current time is 2024-05-15 15:01:19 EST.", "Request ID: req_1a2b"]) \
        == "[2024-05-15 15:01:19 EST | req_1a2b]"
    assert values_line(["Current time: Wed, 15 May 2024 15:00:22 -0500"]) == "[Wed, 15 May 2024 15:00:22 -0500]"
    assert values_line(["2024-05-15 15:01:19"]) == "[2024-05-15 15:01:19]"  # no label: the line whole
    assert note_text(["Request ID: r1"], ["x [see note 1 at the end] y"], "inline") == \
        f"[r1]\n{NOTE_HEADER}\n[1] x [see note 1 at the end] y"
    assert note_text(["Request ID: r1"], [], "end") == "Request ID: r1"


def test_openai_system_end_keeps_a_developer_role() -> None:
    def make(minute: str) -> dict[str, Any]:
        body = _tool_loop(minute)
        body["messages"][0] = dict(body["messages"][0], role="developer")
        return body
    r = clock_session(make, ["15", "16"], "openai", hoist_target="system_end")[1]
    assert r.body["messages"][-1]["role"] == "developer"


def test_reminder_after_a_user_message_is_joined_to_it() -> None:
    r = clock_session(lambda m: _b03(m), ["15", "16"], "openai", hoist_target="reminder")[1]
    last = r.body["messages"][-1]["content"]
    assert len(r.body["messages"]) == 4
    assert last.startswith("Q2\n\n<system-reminder>\n") and last.endswith("\n</system-reminder>")
    assert "Now: 2025-03-04 10:16." in last


def test_conversation_turns_are_never_moved_or_changed() -> None:
    body = _b03("16", 2)
    out = clock_session(lambda m: _b03(m), ["15", "16"], "openai", hoist_target="end")[1].body
    assert out["messages"][1:len(body["messages"])] == body["messages"][1:]


def test_hoist_off_forwards_the_request_unchanged() -> None:
    body = _b03("16", 2)
    r = rewrite_request(body, "openai", ctx(hoist_volatile=False, canonicalize_tools=False))
    assert r.body is body


@pytest.mark.parametrize("placement", ["end", "reminder", "system_end", "inline"])
def test_anthropic_note_goes_after_tool_results_in_the_last_user_turn(placement: str) -> None:
    def make(minute: str) -> dict[str, Any]:
        return {"model": "claude-x", "max_tokens": 9,
                "system": [{"type": "text", "text": f"Now: 2025-03-04T10:{minute}:00Z\n" + RULES}],
                "tools": [{"name": "calc", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "toolu_9", "name": "calc", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_9", "content": "4"}]}]}
    out = clock_session(make, ["15", "16"], "anthropic", hoist_target=placement)[1].body
    assert len(out["messages"]) == 3
    last = out["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and "2025-03-04T10:16:00Z" in last[-1]["text"]
    assert last[-1]["text"].startswith(REMINDER_OPEN) is (resolve(placement, "anthropic") == "reminder")
    assert isinstance(out["system"], list) and "2025" not in out["system"][0]["text"]


def test_last_user_target_keeps_a_string_content_a_string() -> None:
    body = _b03("16", 2)
    out = clock_session(lambda m: _b03(m), ["15", "16"], "openai", hoist_target="last_user")[1].body
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
