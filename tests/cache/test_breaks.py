"""Cache-break diagnosis: each break kind is detected and located; append-only is no break."""

from __future__ import annotations

import copy
import json

from prefixgate.cache.savings.break_spans import find_spans, kinds_in_diff, mask
from prefixgate.cache.savings.breaks import BreakDetector, count_by_kind, format_breaks
from tests.cache.helpers import wc, words
from tests.paths import DATA

TOOLS = json.loads((DATA / "tools" / "tau_bench_airline.json").read_text())


def _body(system: str, messages: list[dict], tools: list[dict] | None = None) -> dict:
    return {"model": "gpt-4o", "tools": tools if tools is not None else TOOLS,
            "messages": [{"role": "system", "content": system}, *messages]}


SYSTEM = "You are Helper. Now: 2025-03-04 10:15. " + words(300, "rule")


def test_volatile_span_detector_names_kinds() -> None:
    assert kinds_in_diff("Now: 2025-03-04 10:15. x", "Now: 2025-03-04 10:16. x") == ["datetime"]
    assert kinds_in_diff("id 3f2b1c9e-0d4a-4b8e-9a7c-1e2f3a4b5c6d",
                         "id 7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d") == ["uuid"]
    assert kinds_in_diff("the cat", "the dog") == []
    assert mask("The current time is 2024-05-15 15:00:00 EST.") == \
        "The current time is \u27e8datetime\u27e9."
    assert [k for _, _, k in find_spans("on 2024-05-20 at 10:30")] == ["date", "time"]


def test_append_only_growth_is_no_break() -> None:
    det = BreakDetector()
    msgs = [{"role": "user", "content": "Q1"}]
    assert det.observe("s", _body(SYSTEM, msgs), wc) is None
    msgs2 = msgs + [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    assert det.observe("s", _body(SYSTEM, msgs2), wc) is None
    assert det.observe("s", _body(SYSTEM, msgs2), wc) is None          # identical resend
    assert det.observe("s", _body(SYSTEM, msgs), wc) is None           # truncated at the end


def test_timestamp_in_system_prompt_is_a_volatile_span_break() -> None:
    # case B03: a minute-resolution clock near the top of the system prompt
    det = BreakDetector(store_text=True)
    det.observe("s", _body(SYSTEM, [{"role": "user", "content": "Q1"}]), wc)
    later = SYSTEM.replace("10:15", "10:16")
    rec = det.observe("s", _body(later, [{"role": "user", "content": "Q1"},
                                         {"role": "assistant", "content": "A1"},
                                         {"role": "user", "content": "Q2"}]), wc)
    assert rec is not None and rec.kind == "volatile_span"
    assert rec.region == "system" and rec.block_index == 0 and rec.volatile_kinds == ("datetime",)
    tools_tokens = sum(wc(json.dumps(t, separators=(",", ":"))) for t in TOOLS)
    assert tools_tokens <= rec.token_offset < tools_tokens + 10   # diverges a few words in
    assert rec.tokens_lost > 300
    assert rec.excerpt_before and "10:15" in rec.excerpt_before
    assert rec.excerpt_after and "10:16" in rec.excerpt_after


def test_no_text_is_kept_in_records_by_default() -> None:
    det = BreakDetector()
    det.observe("s", _body(SYSTEM, [{"role": "user", "content": "Q1"}]), wc)
    rec = det.observe("s", _body(SYSTEM.replace("10:15", "10:17"),
                                 [{"role": "user", "content": "Q1"}]), wc)
    assert rec is not None and rec.excerpt_before is None and rec.excerpt_after is None
    assert "10:1" not in json.dumps(rec.to_dict())


def test_tool_reorder_is_detected() -> None:
    # case B04: same tools, different order
    det = BreakDetector()
    msgs = [{"role": "user", "content": "list repo"}]
    det.observe("s", _body(SYSTEM, msgs), wc)
    swapped = [TOOLS[1], TOOLS[0], *TOOLS[2:]]
    rec = det.observe("s", _body(SYSTEM, msgs, swapped), wc)
    assert rec is not None and rec.kind == "reorder" and rec.region == "tools"
    assert rec.block_index == 0 and rec.token_offset < 10  # only the shared JSON opening


def test_tool_set_change_names_added_and_removed_tools() -> None:
    det = BreakDetector()
    msgs = [{"role": "user", "content": "hi"}]
    det.observe("s", _body(SYSTEM, msgs), wc)
    fewer = [t for t in TOOLS if t["function"]["name"] != "calculate"]
    rec = det.observe("s", _body(SYSTEM, msgs, fewer), wc)
    assert rec is not None and rec.kind == "tool_set_changed"
    assert "calculate" in rec.detail and "removed" in rec.detail
    edited = copy.deepcopy(TOOLS)
    edited[3]["function"]["description"] += " Now with more words."
    rec2 = det.observe("s", _body(SYSTEM, msgs, edited), wc)
    assert rec2 is not None and rec2.kind == "tool_set_changed"


def test_history_edit_is_located_at_the_changed_message() -> None:
    det = BreakDetector()
    msgs = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2 " + words(50)}]
    det.observe("s", _body(SYSTEM, msgs), wc)
    edited = [msgs[0], {"role": "assistant", "content": "A1 (edited)"}, msgs[2],
              {"role": "assistant", "content": "A2"}, {"role": "user", "content": "Q3"}]
    rec = det.observe("s", _body(SYSTEM, edited), wc)
    assert rec is not None and rec.kind == "history_edit"
    assert rec.region == "messages" and rec.block_index == 1
    # the previous Q2 (50+ words) can no longer be reused
    assert rec.tokens_lost >= 50


def test_sessions_are_independent_and_format_lists_totals() -> None:
    det = BreakDetector()
    det.observe("a", _body(SYSTEM, [{"role": "user", "content": "x"}]), wc)
    assert det.observe("b", _body(SYSTEM.replace("10:15", "11:00"),
                                  [{"role": "user", "content": "x"}]), wc) is None
    rec = det.observe("a", _body(SYSTEM.replace("10:15", "11:00"),
                                 [{"role": "user", "content": "x"}]), wc)
    assert rec is not None and rec.session_id == "a" and rec.request_seq == 1
    text = format_breaks([rec])
    assert "volatile_span" in text and "1 break(s)" in text
    assert count_by_kind([rec, rec]) == {"volatile_span": 2}
    assert format_breaks([]) == "no cache breaks recorded"


def test_anthropic_bodies_are_diagnosed_too() -> None:
    det = BreakDetector()
    body = {"model": "claude-sonnet-4-5", "system": SYSTEM,
            "messages": [{"role": "user", "content": "hi"}]}
    det.observe("s", body, wc)
    rec = det.observe("s", dict(body, system=[{"type": "text", "text": SYSTEM.replace(
        "2025-03-04", "2025-03-05"), "cache_control": {"type": "ephemeral"}}]), wc)
    assert rec is not None and rec.kind == "volatile_span" and rec.region == "system"


def test_a_volatile_note_at_the_tail_moving_on_is_no_break() -> None:
    # the rewriter hoists the clock into a trailing block of the newest turn; next turn it moves
    det = BreakDetector()
    note = {"type": "text", "text": "[note 1] The current time is 2024-05-15 15:00:10 EST."}
    first = {"model": "claude-sonnet-4-5", "system": SYSTEM, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Q1"}, note]}]}
    det.observe("s", first, wc)
    note2 = {"type": "text", "text": "[note 1] The current time is 2024-05-15 15:00:31 EST."}
    second = {"model": "claude-sonnet-4-5", "system": SYSTEM, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Q1"}]},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": [{"type": "text", "text": "Q2"}, note2]}]}
    assert det.observe("s", second, wc) is None
    # but an edited earlier turn is still reported
    third = {**second, "messages": [{"role": "user", "content": "Q1 edited"}, *second["messages"][1:]]}
    rec = det.observe("s", third, wc)
    assert rec is not None and rec.kind == "history_edit"


def test_a_volatile_note_message_at_the_end_moving_on_is_no_break() -> None:
    det = BreakDetector()
    note = {"role": "user", "content": "[1] The current time is 2024-05-15 15:00:10 EST."}
    det.observe("s", _body(SYSTEM, [{"role": "user", "content": "Q1"}, note]), wc)
    note2 = {"role": "user", "content": "[1] The current time is 2024-05-15 15:00:40 EST."}
    assert det.observe("s", _body(SYSTEM, [{"role": "user", "content": "Q1"},
                                           {"role": "assistant", "content": "A1"}, note2]),
                       wc) is None


def test_the_breaks_table_fits_80_columns_and_keeps_every_word() -> None:
    """``report --breaks`` wrapped at 80 columns (issue 22, item 7): long details and excerpts go
    on indented lines, every line fits, no word of the detail is lost."""
    from prefixgate.cache.savings.breaks import BreakRecord

    detail = "system text changed at a volatile span (datetime) " * 4
    long = BreakRecord("sess-" + "f" * 40, 12, "volatile_span", "messages", 123, 4, 9, 4096, 123456,
                       detail.strip(), ("datetime",), "before " * 30, "after " * 30)
    short = BreakRecord("s2", 1, "tool_set", "tools", 0, 0, 0, 10, 20, "tool added")
    text = format_breaks([long, short])
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)
    assert " ".join(text.split()).count("system text changed at a volatile span (datetime)") == 4
    assert any(line.endswith("tool added") and line.startswith("s2") for line in text.splitlines())
    assert "2 break(s)" in text
    assert all(len(line) <= 76 for line in format_breaks([long], width=76).splitlines())


def test_breaks_lost_to_a_changing_clock_point_at_the_opt_in_move_with_their_tokens() -> None:
    from prefixgate.cache.savings.breaks import BreakRecord, break_advice

    clock = BreakRecord("a", 2, "volatile_span", "system", 0, 0, 0, 10, 300, "clock changed")
    clock2 = BreakRecord("b", 3, "volatile_span", "system", 0, 0, 0, 20, 250, "clock changed")
    other = BreakRecord("a", 3, "history_edit", "messages", 1, 0, 0, 30, 700, "edited")
    advice = break_advice([clock, other, clock2])
    assert advice.startswith("550 of those tokens") and "hoist_volatile: true" in advice
    assert break_advice([other]) == "" and break_advice([]) == ""
    assert " ".join(format_breaks([clock, other, clock2]).split()).endswith(" ".join(advice.split()))
    assert "hoist_volatile" not in format_breaks([other])
