"""The meaning checker itself: it catches each loss the hostile tester found, and lets through
what a pruning pass may remove above its budget."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from prefixgate.config.schema import RewriteSettings
from tests.rewriter.meaning import MeaningViolation, check_meaning

ON = RewriteSettings(prune_history=True, history_high_watermark_tokens=50,
                     history_low_watermark_tokens=10, prune_rag=True, rag_budget_tokens=10)
LONG = "words " * 200


def chat() -> dict[str, Any]:
    return {"model": "m", "messages": [
        {"role": "system", "content": "Now: 2026-12-01 10:00. Be brief."},
        {"role": "user", "content": "TASK: do both:\n[1] rename a\n[2] rename b"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "f",
                                                                            "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": LONG},
        {"role": "assistant", "content": "middle " + LONG},
        {"role": "user", "content": "and now?"}]}


def test_identity_and_additions_pass() -> None:
    body = chat()
    check_meaning(body, copy.deepcopy(body), "openai")
    more = copy.deepcopy(body)
    more["messages"].append({"role": "user", "content": "(note: Now: 2026-12-01 10:00)"})
    more["messages"][0]["content"] = "Now: [see note 1 at the end]. Be brief."
    check_meaning(body, more, "openai")


def test_a_dropped_list_item_is_caught_even_with_every_pass_on() -> None:
    sent = chat()
    sent["messages"][1]["content"] = "TASK: do both:\n[1] rename a"
    with pytest.raises(MeaningViolation):
        check_meaning(chat(), sent, "openai", settings=ON)


def test_a_dropped_first_user_turn_is_caught() -> None:
    sent = chat()
    del sent["messages"][1:5]
    with pytest.raises(MeaningViolation, match="user_text"):
        check_meaning(chat(), sent, "openai", settings=ON)


def test_dropping_middle_turns_above_the_watermark_is_allowed_not_below() -> None:
    sent = chat()
    del sent["messages"][4]
    check_meaning(chat(), sent, "openai", settings=ON)
    with pytest.raises(MeaningViolation):
        check_meaning(chat(), sent, "openai",
                      settings=ON.model_copy(update={"history_high_watermark_tokens": 10**6}))


def test_elided_tool_result_allowed_only_with_history_pruning() -> None:
    sent = chat()
    sent["messages"][3]["content"] = "[prefixgate: the earlier result of f was elided (9 tokens)]"
    check_meaning(chat(), sent, "openai", settings=ON)
    with pytest.raises(MeaningViolation, match="tool_result"):
        check_meaning(chat(), sent, "openai")


def test_reordered_tool_calls_are_caught() -> None:
    body = chat()
    body["messages"][2]["tool_calls"].append(
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}})
    body["messages"].insert(4, {"role": "tool", "tool_call_id": "c2", "content": "ok"})
    sent = copy.deepcopy(body)
    sent["messages"][2]["tool_calls"].reverse()
    with pytest.raises(MeaningViolation, match="tool_call"):
        check_meaning(body, sent, "openai")


def test_lost_system_words_are_caught() -> None:
    sent = chat()
    sent["messages"][0]["content"] = "Be brief."
    with pytest.raises(MeaningViolation, match="system"):
        check_meaning(chat(), sent, "openai", settings=ON)


def test_more_than_four_breakpoints_including_nested_ones_are_caught() -> None:
    cc = {"type": "ephemeral"}
    body = {"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": [
                    {"type": "text", "text": str(i), "cache_control": cc} for i in range(3)]},
                {"type": "text", "text": "q"}]}]}
    sent = copy.deepcopy(body)
    sent["system"][0]["cache_control"] = cc
    check_meaning(body, sent, "anthropic")
    sent["messages"][0]["content"][1]["cache_control"] = cc
    with pytest.raises(MeaningViolation, match="breakpoints"):
        check_meaning(body, sent, "anthropic")


def test_works_across_apis_for_a_bridged_body() -> None:
    client = {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "one"},
                                     {"type": "text", "text": "two"}]}]}
    sent = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "one\ntwo"}]}
    check_meaning(client, sent, "openai", "anthropic")
    sent["messages"][0]["content"] = "two\none"
    with pytest.raises(MeaningViolation):
        check_meaning(client, sent, "openai", "anthropic")


def test_user_words_lost_between_pruned_passages_are_caught() -> None:
    client = {"model": "m", "messages": [{"role": "user", "content":
              '<doc id="1">' + LONG + '</doc> keep these words <doc id="2">x</doc> end'}]}
    ok = copy.deepcopy(client)
    ok["messages"][0]["content"] = '<doc id="1">' + LONG + '</doc> keep these words  end'
    check_meaning(client, ok, "openai", settings=ON)
    bad = copy.deepcopy(client)
    bad["messages"][0]["content"] = '<doc id="1">' + LONG + '</doc> end'
    with pytest.raises(MeaningViolation, match="user_text"):
        check_meaning(client, bad, "openai", settings=ON)
