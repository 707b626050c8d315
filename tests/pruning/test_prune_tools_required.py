"""prune_tools keeps every tool an instruction or a choice names (issue 8, class 3)."""

from __future__ import annotations

from typing import Any

from prefixgate.rewriter.passes.prune_tools import run
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import violations
from tests.pruning.test_prune_tools import catalog, names
from tests.rewriter.helpers import ctx

ASK = "Translate 'good morning' into French please."


def openai_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "tools": catalog("openai"),
            "messages": [{"role": "user", "content": ASK}], **extra}


def kept(body: dict[str, Any], api: str = "openai") -> list[str]:
    out, edits = run(wire.parse(body, api), ctx(prune_tools=True))
    assert edits[0].applied, edits  # the catalog was pruned: the test is meaningful
    assert not violations(out)
    return names(wire.render(out))


def test_tools_named_in_openai_allowed_tools_are_kept() -> None:
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "filler_tool_03"}},
        {"type": "function", "function": {"name": "stock_quote"}}]}}
    got = kept(openai_body(tool_choice=choice))
    assert "filler_tool_03" in got and "stock_quote" in got


def test_tools_named_in_responses_style_allowed_tools_are_kept() -> None:
    choice = {"type": "allowed_tools", "mode": "auto",
              "tools": [{"type": "function", "name": "filler_tool_07"}]}
    assert "filler_tool_07" in kept(openai_body(tool_choice=choice))


def test_tool_named_by_anthropic_tool_choice_is_kept() -> None:
    body = {"model": "claude-x", "max_tokens": 64, "tools": catalog("anthropic"),
            "tool_choice": {"type": "tool", "name": "filler_tool_11"},
            "messages": [{"role": "user", "content": ASK}]}
    assert "filler_tool_11" in kept(body, "anthropic")


def test_tool_the_system_prompt_says_to_always_call_is_kept() -> None:
    for api in ("openai", "anthropic"):
        rule = "Always call filler_tool_05 before answering, to log the request."
        if api == "openai":
            body = openai_body()
            body["messages"].insert(0, {"role": "system", "content": rule})
        else:
            body = {"model": "claude-x", "max_tokens": 64, "tools": catalog("anthropic"),
                    "system": [{"type": "text", "text": rule}],
                    "messages": [{"role": "user", "content": ASK}]}
        assert "filler_tool_05" in kept(body, api)


def test_tool_named_in_a_later_developer_message_is_kept() -> None:
    body = openai_body()
    body["messages"] += [{"role": "assistant", "content": "Bonjour."},
                         {"role": "developer", "content": "From now on use `filler_tool_09`."},
                         {"role": "user", "content": ASK}]
    assert "filler_tool_09" in kept(body)


def test_tool_called_through_legacy_function_call_in_history_is_kept() -> None:
    body = openai_body()
    body["messages"] += [
        {"role": "assistant", "content": None,
         "function_call": {"name": "filler_tool_02", "arguments": "{}"}},
        {"role": "function", "name": "filler_tool_02", "content": "ok"},
        {"role": "user", "content": ASK}]
    assert "filler_tool_02" in kept(body)


def test_a_word_that_is_only_part_of_a_tool_name_keeps_nothing_extra() -> None:
    plain = kept(openai_body())
    body = openai_body()
    body["messages"].insert(0, {"role": "system", "content": "Be brief. filler_tool is fun."})
    assert kept(body) == plain
