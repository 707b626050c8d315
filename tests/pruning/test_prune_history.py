"""prune_history: pairs stay whole (B15, B16), watermark compaction stays append-only."""

from __future__ import annotations

import json
from typing import Any

from prefixgate.rewriter.passes.prune_history import run
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import violations
from tests.rewriter.helpers import ctx, replay

FILLER = "lorem ipsum dolor sit amet " * 200  # ~1,000 tokens


def small_budget(**kw: Any) -> dict[str, Any]:
    return dict(prune_history=True, history_high_watermark_tokens=600,
                history_low_watermark_tokens=300, **kw)


def b15() -> dict[str, Any]:
    return {"model": "gpt-x", "tools": [{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object"}}}], "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "old long question " + FILLER},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": FILLER},
        {"role": "user", "content": "I see"},
        {"role": "assistant", "content": "Anything else?"},
        {"role": "user", "content": "yes, summarize"}]}


def test_trimming_never_leaves_an_orphan_tool_message_first() -> None:
    out, edits = run(wire.parse(b15(), "openai"), ctx(**small_budget()))
    body = wire.render(out)
    assert edits[0].applied
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert body["messages"][1]["role"] == "user"
    assert body["messages"][-1] == {"role": "user", "content": "yes, summarize"}
    assert not violations(out)


def b16(api: str) -> dict[str, Any]:
    if api == "openai":
        return {"model": "gpt-x", "tools": [{"type": "function", "function": {
            "name": "weather", "parameters": {"type": "object"}}}], "messages": [
            {"role": "user", "content": "compare two cities"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": FILLER},
            {"role": "tool", "tool_call_id": "call_b", "content": FILLER},
            {"role": "assistant", "content": "Oslo is colder."},
            {"role": "user", "content": "thanks, and now?"}]}
    return {"model": "claude-x", "max_tokens": 64, "tools": [
        {"name": "weather", "input_schema": {"type": "object"}}], "messages": [
        {"role": "user", "content": "compare two cities"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_b", "name": "weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": FILLER},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": FILLER}]},
        {"role": "assistant", "content": "Oslo is colder."},
        {"role": "user", "content": "thanks, and now?"}]}


def test_under_budget_passes_through_byte_identical() -> None:
    for api in ("openai", "anthropic"):
        body = b16(api)
        res = replay([body], api, prune_history=True, history_high_watermark_tokens=100_000,
                     history_low_watermark_tokens=50_000)[0]
        assert res.body is body


def test_over_budget_parallel_results_are_elided_in_place_never_split_from_calls() -> None:
    for api in ("openai", "anthropic"):
        body = b16(api)
        out, edits = run(wire.parse(body, api), ctx(**small_budget()))
        wire_out = wire.render(out)
        assert edits[0].applied and not violations(out)
        text = json.dumps(wire_out)
        assert text.count("was elided to save context") == 2
        # one result per call id, right after the assistant message, in order
        ids = [m.get("tool_call_id") for m in wire_out["messages"] if m.get("role") == "tool"]
        if api == "openai":
            assert ids == ["call_a", "call_b"]
            assert wire_out["messages"][1]["tool_calls"][0]["id"] == "call_a"
        else:
            res = wire_out["messages"][2]["content"]
            assert [b["tool_use_id"] for b in res] == ["toolu_a", "toolu_b"]


def test_newest_tool_round_is_not_elided() -> None:
    body = b16("openai")
    body["messages"] = body["messages"][:4]  # the request ends right after the results
    out, _ = run(wire.parse(body, "openai"), ctx(**small_budget()))
    assert "elided" not in json.dumps(wire.render(out))
    assert not violations(out)


def _growing_session(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    bodies = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i} " + "word " * 60})
        bodies.append({"model": "gpt-x", "messages": [{"role": "system", "content": "sys"},
                                                      *msgs]})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "text " * 60})
    return bodies


def test_watermark_compaction_keeps_later_turns_append_only() -> None:
    results = replay(_growing_session(14), "openai", prune_history=True,
                     history_high_watermark_tokens=600, history_low_watermark_tokens=300)
    sent = [r.body["messages"] for r in results]
    compactions = [i for i in range(1, len(sent)) if sent[i][:len(sent[i - 1])] != sent[i - 1]]
    # a sliding window would break the prefix on every turn past the budget
    assert 1 <= len(compactions) <= len(sent) // 3
    for i in range(1, len(sent)):
        if i not in compactions:
            assert sent[i][:len(sent[i - 1])] == sent[i - 1]
    for m in sent:
        assert m[0]["role"] == "system" and m[1]["role"] == "user"
        assert m[-1]["role"] == "user"


def test_single_turn_agent_loop_is_elided_never_dropped() -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "fix the bug"}]
    for k in range(6):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{k}", "type": "function",
             "function": {"name": "bash", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{k}", "content": FILLER})
    body = {"model": "gpt-x", "tools": [{"type": "function", "function": {
        "name": "bash", "parameters": {"type": "object"}}}], "messages": msgs}
    out, edits = run(wire.parse(body, "openai"), ctx(**small_budget()))
    sent = wire.render(out)["messages"]
    assert edits[0].applied and not violations(out)
    assert len(sent) == len(msgs) and sent[0] == msgs[0]
    assert sent[-1] == msgs[-1]  # the newest round's result is intact
    assert all("elided" in m["content"] for m in sent[2:-1] if m["role"] == "tool")
