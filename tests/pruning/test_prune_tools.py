"""prune_tools: required tools survive (B06), stickiness, thresholds, markers."""

from __future__ import annotations

import json
from typing import Any

from prefixgate.rewriter.passes.prune_tools import run
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import violations
from tests.rewriter.helpers import ctx, replay

TOPICS = [
    ("get_weather", "Current weather and temperature forecast for a city"),
    ("send_email", "Send an email message to a recipient address"),
    ("book_flight", "Book a flight ticket between two airports"),
    ("cancel_booking", "Cancel an existing hotel or flight booking"),
    ("convert_currency", "Convert an amount of money between currencies"),
    ("translate_text", "Translate text between languages"),
    ("play_song", "Play a song or music track by an artist"),
    ("set_alarm", "Set an alarm clock at a time"),
    ("search_recipes", "Search cooking recipes by ingredient"),
    ("stock_quote", "Latest stock market price quote for a ticker symbol"),
    ("create_issue", "Create a GitHub issue in a repository"),
    ("list_files", "List files in a directory of the filesystem"),
]


def catalog(api: str, n: int = 40) -> list[dict[str, Any]]:
    """``n`` tools: the 12 topical ones plus numbered filler tools about unrelated things."""
    items = list(TOPICS) + [(f"filler_tool_{i:02d}", f"Manage widget inventory shelf {i}")
                            for i in range(n - len(TOPICS))]
    if api == "anthropic":
        return [{"name": a, "description": d, "input_schema": {
            "type": "object", "properties": {"x": {"type": "string"}}}} for a, d in items]
    return [{"type": "function", "function": {"name": a, "description": d, "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}} for a, d in items]


def names(body: dict[str, Any]) -> list[str]:
    return [t.get("name") or t["function"]["name"] for t in body.get("tools", [])]


def b06_anthropic() -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 128, "tools": catalog("anthropic"), "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_A",
                                           "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_A",
                                      "content": "3C"},
                                     {"type": "text", "text": "Now translate a haiku about it "
                                                              "into French."}]}]}


def _called_in_history(tool: str) -> dict[str, Any]:
    """B06 with the history calling ``tool``, a tool no user text ranks (nothing in common)."""
    body = b06_anthropic()
    body["messages"][1]["content"][0]["name"] = tool
    body["messages"][0]["content"] = "Could you help me out?"
    return body


def test_keeps_tools_called_in_history_even_when_irrelevant_to_latest_turn() -> None:
    body = _called_in_history("filler_tool_17")
    out, edits = run(wire.parse(body, "anthropic"), ctx(prune_tools=True))
    kept = [t.name for t in out.tools or ()]
    assert edits[0].applied and len(kept) < 40
    assert "filler_tool_17" in kept and "translate_text" in kept
    assert not violations(out)
    # control: the same conversation calling another tool does not keep filler_tool_17, so it
    # was kept because the history calls it, not because ranking liked it
    other, _ = run(wire.parse(_called_in_history("filler_tool_05"), "anthropic"),
                   ctx(prune_tools=True))
    assert "filler_tool_17" not in [t.name for t in other.tools or ()]


def test_keeps_openai_tool_calls_and_tool_choice_target() -> None:
    body = {"model": "gpt-x", "tools": catalog("openai"),
            "tool_choice": {"type": "function", "function": {"name": "stock_quote"}},
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3C"},
                {"role": "user", "content": "Now send an email to Ann about it."}]}
    out, edits = run(wire.parse(body, "openai"), ctx(prune_tools=True))
    kept = [t.name for t in out.tools or ()]
    assert edits[0].applied
    assert {"get_weather", "stock_quote", "send_email"} <= set(kept)
    assert not violations(out)


def test_pinned_tools_always_kept_and_small_catalogs_untouched() -> None:
    body = b06_anthropic()
    out, _ = run(wire.parse(body, "anthropic"), ctx(prune_tools=True, pinned_tools=["set_alarm"]))
    assert "set_alarm" in [t.name for t in out.tools or ()]
    body["tools"] = body["tools"][:12]
    out, edits = run(wire.parse(body, "anthropic"), ctx(prune_tools=True))
    assert not edits[0].applied and out.tools is not None and len(out.tools) == 12


def test_kept_tools_stay_in_canonical_order_and_edit_counts_tokens() -> None:
    """With ``tool_order: "name"`` (opt-in; the default ``first_seen`` keeps a first request's
    order as sent) canonicalize_tools sorts by name, and pruning must keep that order."""
    res = replay([b06_anthropic()], "anthropic", prune_tools=True, tool_order="name")[0]
    kept = names(res.body)
    assert kept == sorted(kept)  # canonicalize_tools sorted by name; pruning keeps that order
    edit = next(e for e in res.edits if e.pass_name == "prune_tools")
    assert edit.tokens_after < edit.tokens_before


def _session_turns() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    bodies = []
    follow = ["And in Rome tomorrow?", "Is it colder than Oslo?", "Thanks, what about Paris?"]
    for i, q in enumerate(follow):
        bodies.append({"model": "gpt-x", "tools": catalog("openai"), "messages": list(msgs)})
        msgs += [{"role": "assistant", "content": f"It is {i} C."}, {"role": "user", "content": q}]
    bodies.append({"model": "gpt-x", "tools": catalog("openai"), "messages": list(msgs)})
    return bodies


def test_tools_block_is_byte_identical_across_turns_when_no_new_tool_is_needed() -> None:
    results = replay(_session_turns(), "openai", prune_tools=True)
    blocks = [json.dumps(r.body["tools"]) for r in results]
    assert len(set(blocks)) == 1
    assert "get_weather" in names(results[0].body) and len(names(results[0].body)) < 40


def test_kept_set_grows_when_a_turn_needs_a_new_tool() -> None:
    bodies = _session_turns()
    last = bodies[-1]
    extra = dict(last, messages=last["messages"] + [
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Get me the stock market price quote for ticker AAPL"}])
    results = replay(bodies + [extra], "openai", prune_tools=True)
    before, after = names(results[-2].body), names(results[-1].body)
    assert set(before) < set(after) and "stock_quote" in after


def test_never_sends_empty_tools_while_tool_blocks_remain() -> None:
    body = b06_anthropic()
    body["messages"][-1]["content"][1]["text"] = "zzzz qqqq"
    out, _ = run(wire.parse(body, "anthropic"), ctx(prune_tools=True))
    assert out.tools and "get_weather" in [t.name for t in out.tools]


def test_cache_marker_on_dropped_tool_moves_to_kept_tool() -> None:
    body = b06_anthropic()
    body["tools"][-1]["cache_control"] = {"type": "ephemeral"}
    out, _ = run(wire.parse(body, "anthropic"), ctx(prune_tools=True))
    marks = [t for t in out.tools or () if t.cache_control is not None]
    assert len(marks) == 1


def test_sticky_set_is_rebuilt_at_a_history_compaction() -> None:
    body = {"model": "gpt-x", "tools": catalog("openai"), "messages": [
        {"role": "user", "content": "old chat " + "blah " * 400},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What is the weather in Oslo?"}]}
    memory = {"prune_tools": {"kept": [f"filler_tool_{i:02d}" for i in range(20, 28)]}}
    sticky = run(wire.parse(body, "openai"), ctx(session=memory, prune_tools=True))[0]
    assert {"filler_tool_20", "filler_tool_27"} <= {t.name for t in sticky.tools or ()}
    compacting = ctx(session=memory, prune_tools=True, prune_history=True,
                     history_high_watermark_tokens=200, history_low_watermark_tokens=100)
    rebuilt = run(wire.parse(body, "openai"), compacting)[0]
    kept = {t.name for t in rebuilt.tools or ()}
    assert "get_weather" in kept and "filler_tool_27" not in kept
