"""Breakpoints are counted wherever Anthropic allows them, nested blocks included (issue 8,
class 4): the planner never takes a request past 4, the validator sees every marker."""

from __future__ import annotations

from typing import Any

from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import breakpoint_count, violations
from tests.rewriter.helpers import ctx

BIG = "Static instructions about the product and its policies. " * 300
CC = {"type": "ephemeral"}


def count_markers(value: Any, key: str = "") -> int:
    """Independent count: every ``cache_control`` dict anywhere, tool inputs excluded."""
    if key == "input":
        return 0
    if isinstance(value, dict):
        own = 1 if isinstance(value.get("cache_control"), dict) else 0
        return own + sum(count_markers(v, k) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return sum(count_markers(v) for v in value)
    return 0


def body_with_nested(n_nested: int, where: str = "tool_result") -> dict[str, Any]:
    inner = [{"type": "text", "text": f"row {i} " * 50, "cache_control": dict(CC)}
             for i in range(n_nested)]
    if where == "tool_result":
        carrier: dict[str, Any] = {"type": "tool_result", "tool_use_id": "t1", "content": inner}
    elif where == "search_result":
        carrier = {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "search_result", "source": "https://x", "title": "x", "content": inner}]}
    else:
        carrier = {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "document", "source": {"type": "content", "content": inner}}]}
    return {"model": "claude-sonnet-4-5", "max_tokens": 32, "system": BIG,
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "Look it up."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                                   "name": "lookup", "input": {"q": "x"}}]},
                {"role": "user", "content": [carrier, {"type": "text", "text": "Summarise."}]}]}


def test_planner_counts_markers_nested_in_tool_result_content() -> None:
    for n in range(0, 5):
        body = body_with_nested(n)
        r = rewrite_request(body, "anthropic", ctx("anthropic", model="claude-sonnet-4-5"))
        assert count_markers(r.body) <= 4, (n, count_markers(r.body))
        assert count_markers(r.body) >= n  # the client's markers are never removed


def test_planner_output_itself_stays_within_four_markers() -> None:
    from prefixgate.rewriter.passes.breakpoints import run
    for where in ("tool_result", "search_result", "document"):
        for n in range(0, 5):
            prompt = wire.parse(body_with_nested(n, where), "anthropic")
            out, _ = run(prompt, ctx("anthropic", model="claude-sonnet-4-5"))
            assert count_markers(wire.render(out)) <= 4, (where, n)


def test_validator_counts_nested_markers_in_every_allowed_place() -> None:
    for where in ("tool_result", "search_result", "document"):
        body = body_with_nested(5, where)
        prompt = wire.parse(body, "anthropic")
        assert breakpoint_count(prompt) == 5 == count_markers(body)
        assert any(k == "too_many_breakpoints" for k, _ in violations(prompt))


def test_a_cache_control_key_inside_tool_input_is_data_not_a_breakpoint() -> None:
    body = body_with_nested(0)
    body["messages"][1]["content"][0]["input"] = {"cache_control": {"type": "ephemeral"}}
    assert breakpoint_count(wire.parse(body, "anthropic")) == 0


def test_nested_5m_marker_before_a_1h_one_is_a_ttl_order_violation() -> None:
    body = body_with_nested(1)
    body["messages"][2]["content"][1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert ("ttl_order", "1h after 5m") in violations(wire.parse(body, "anthropic"))


def test_a_short_text_document_is_counted_by_its_text_not_as_a_file() -> None:
    from prefixgate.rewriter.passes.breakpoints import run
    system = "You answer questions about the attached note, briefly and politely. " * 4
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                          "data": "The meeting is at noon."}}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 32, "system": system, "messages": [
        {"role": "user", "content": [doc, {"type": "text", "text": "When is it?"}]}]}
    out, edits = run(wire.parse(body, "anthropic"), ctx("anthropic", model="claude-sonnet-4-5"))
    assert count_markers(wire.render(out)) == 0, edits  # ~70 tokens: below the 1,024 minimum


def test_a_top_level_1h_cache_control_makes_our_markers_1h_too() -> None:
    from prefixgate.rewriter.passes.breakpoints import run
    body = body_with_nested(0)
    body["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    out, _ = run(wire.parse(body, "anthropic"), ctx("anthropic", model="claude-sonnet-4-5"))
    assert count_markers(wire.render(out)) > 1  # we placed at least one
    assert not violations(out), violations(out)
